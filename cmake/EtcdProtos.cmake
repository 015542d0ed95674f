# Generates C++ gRPC stubs for etcd's v3 API from the .proto files that Debian's
# golang-etcd-server-dev installs. The files are never copied into this repository:
# they are stripped of their Go-only annotations into the build tree, then compiled.
#
# Defines the static library `etcd_api` (headers under <build>/gen, e.g.
# "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h").

set(ETCD_PROTO_ROOT "/usr/share/gocode/src/go.etcd.io/etcd" CACHE PATH
    "Directory holding etcd's .proto tree (package golang-etcd-server-dev)")
if(NOT EXISTS "${ETCD_PROTO_ROOT}/etcdserver/etcdserverpb/rpc.proto")
  message(FATAL_ERROR "etcd's .proto files are missing under ${ETCD_PROTO_ROOT}: "
                      "run scripts/setup.sh (package golang-etcd-server-dev)")
endif()

set(ETCD_GEN_DIR "${CMAKE_BINARY_DIR}/gen")
# path under ETCD_PROTO_ROOT ; import path etcd uses for it ; needs grpc services
set(_etcd_protos
  "mvcc/mvccpb/kv.proto"
  "auth/authpb/auth.proto"
  "etcdserver/etcdserverpb/rpc.proto"
  "etcdserver/api/v3lock/v3lockpb/v3lock.proto")
set(_etcd_grpc_protos
  "etcdserver/etcdserverpb/rpc.proto"
  "etcdserver/api/v3lock/v3lockpb/v3lock.proto")

set(_etcd_srcs)
foreach(rel IN LISTS _etcd_protos)
  get_filename_component(dir "${rel}" DIRECTORY)
  get_filename_component(stem "${rel}" NAME_WE)
  set(stripped "${ETCD_GEN_DIR}/etcd/${rel}")
  set(outbase "${ETCD_GEN_DIR}/etcd/${dir}/${stem}")
  add_custom_command(
    OUTPUT "${stripped}"
    COMMAND ${CMAKE_COMMAND} -DIN=${ETCD_PROTO_ROOT}/${rel} -DOUT=${stripped}
            -P ${PROJECT_SOURCE_DIR}/cmake/strip_etcd_proto.cmake
    DEPENDS "${ETCD_PROTO_ROOT}/${rel}" "${PROJECT_SOURCE_DIR}/cmake/strip_etcd_proto.cmake"
    COMMENT "Stripping annotations from etcd ${rel}")
  list(APPEND _stripped "${stripped}")
endforeach()

foreach(rel IN LISTS _etcd_protos)
  get_filename_component(dir "${rel}" DIRECTORY)
  get_filename_component(stem "${rel}" NAME_WE)
  set(outbase "${ETCD_GEN_DIR}/etcd/${dir}/${stem}")
  set(outs "${outbase}.pb.cc" "${outbase}.pb.h")
  set(grpc_args)
  if(rel IN_LIST _etcd_grpc_protos)
    list(APPEND outs "${outbase}.grpc.pb.cc" "${outbase}.grpc.pb.h")
    set(grpc_args --grpc_out=${ETCD_GEN_DIR} --plugin=protoc-gen-grpc=${GRPC_CPP_PLUGIN})
  endif()
  add_custom_command(
    OUTPUT ${outs}
    COMMAND ${PROTOC} -I ${ETCD_GEN_DIR} --cpp_out=${ETCD_GEN_DIR} ${grpc_args}
            "${ETCD_GEN_DIR}/etcd/${rel}"
    DEPENDS ${_stripped}
    COMMENT "Generating C++ for etcd ${rel}")
  foreach(o IN LISTS outs)
    if(o MATCHES "\\.cc$")
      list(APPEND _etcd_srcs "${o}")
    endif()
  endforeach()
endforeach()

add_library(etcd_api STATIC ${_etcd_srcs})
target_include_directories(etcd_api SYSTEM PUBLIC "${ETCD_GEN_DIR}")
target_link_libraries(etcd_api PUBLIC gRPC::grpc++ protobuf::libprotobuf)
