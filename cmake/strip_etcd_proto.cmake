# Copies one of etcd's .proto files (from Debian's golang-etcd-server-dev) to the
# build tree without the gogoproto and google.api annotations it imports, which
# only matter to etcd's Go build. Invoked as:
#   cmake -DIN=<file.proto> -DOUT=<file.proto> -P strip_etcd_proto.cmake
file(READ "${IN}" text)
# imports of the annotation packages
string(REGEX REPLACE "import \"gogoproto/gogo.proto\";" "" text "${text}")
string(REGEX REPLACE "import \"google/api/annotations.proto\";" "" text "${text}")
# file-level `option (gogoproto.x) = y;`
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;" "" text "${text}")
# method-level `option (google.api.http) = { ... };` blocks, with at most one
# level of nested braces (additional_bindings { ... })
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {([^{}]*{[^{}]*})*[^{}]*};" ""
       text "${text}")
# field-level `[(gogoproto.x) = y, ...]`
string(REGEX REPLACE "\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api")
  message(FATAL_ERROR "strip_etcd_proto: annotations left in ${IN}")
endif()
file(WRITE "${OUT}" "${text}")
