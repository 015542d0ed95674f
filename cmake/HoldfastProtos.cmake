# holdfast's own protos: the public API (proto/holdfast/v1) and the records it
# persists in etcd (src/lock/records.proto). Generated into <build>/gen.
set(HF_GEN_DIR "${CMAKE_BINARY_DIR}/gen")

# hf_proto_library(NAME <target> ROOT <include root> FILES <paths under ROOT>
#                  [GRPC] [DEPS <targets>])
function(hf_proto_library)
  cmake_parse_arguments(A "GRPC" "NAME;ROOT" "FILES;DEPS" ${ARGN})
  set(srcs)
  foreach(rel IN LISTS A_FILES)
    string(REGEX REPLACE "\\.proto$" "" base "${rel}")
    set(outs "${HF_GEN_DIR}/${base}.pb.cc" "${HF_GEN_DIR}/${base}.pb.h")
    set(grpc_args)
    if(A_GRPC)
      list(APPEND outs "${HF_GEN_DIR}/${base}.grpc.pb.cc" "${HF_GEN_DIR}/${base}.grpc.pb.h")
      set(grpc_args --grpc_out=${HF_GEN_DIR} --plugin=protoc-gen-grpc=${GRPC_CPP_PLUGIN})
    endif()
    add_custom_command(
      OUTPUT ${outs}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${HF_GEN_DIR}
      COMMAND ${PROTOC} -I ${A_ROOT} -I ${PROJECT_SOURCE_DIR}/proto
              --cpp_out=${HF_GEN_DIR} ${grpc_args} ${A_ROOT}/${rel}
      DEPENDS ${A_ROOT}/${rel}
      COMMENT "Generating C++ for ${rel}")
    foreach(o IN LISTS outs)
      if(o MATCHES "\\.cc$")
        list(APPEND srcs "${o}")
      endif()
    endforeach()
  endforeach()
  add_library(${A_NAME} STATIC ${srcs})
  target_include_directories(${A_NAME} SYSTEM PUBLIC "${HF_GEN_DIR}")
  target_link_libraries(${A_NAME} PUBLIC gRPC::grpc++ protobuf::libprotobuf ${A_DEPS})
endfunction()

hf_proto_library(NAME holdfast_api ROOT ${PROJECT_SOURCE_DIR}/proto GRPC
  FILES holdfast/v1/types.proto holdfast/v1/session.proto
        holdfast/v1/lock.proto holdfast/v1/admin.proto)

# The standard gRPC health protocol, served by holdfastd (src/server/health_service.h).
hf_proto_library(NAME grpc_health_api ROOT ${PROJECT_SOURCE_DIR}/proto GRPC
  FILES grpc/health/v1/health.proto)
