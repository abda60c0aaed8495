// Asking a mesh for an axis it does not have.
#include <edl/mesh/all.hpp>
int main() { return static_cast<int>(edl::Mesh<"dp", "tp">::axis_index<"fsdp">()); }
