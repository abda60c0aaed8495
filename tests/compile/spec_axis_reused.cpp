// One mesh axis splitting two dimensions.
#include <edl/tensor/all.hpp>
int main() { return static_cast<int>(edl::P<"tp", edl::axes("dp", "tp")>::rank); }
