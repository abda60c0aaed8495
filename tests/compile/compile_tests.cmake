# Misuses the types catch: each file must fail to compile with the quoted static_assert.
edl_add_compile_fail_test(spec_rank_mismatch spec_rank_mismatch.cpp "PartitionSpec's rank differs")
edl_add_compile_fail_test(spec_unknown_axis spec_unknown_axis.cpp "not an axis of the mesh")
edl_add_compile_fail_test(spec_axis_reused spec_axis_reused.cpp "used by more than one dimension")
edl_add_compile_fail_test(mesh_unknown_axis mesh_unknown_axis.cpp "not one of the mesh's axes")
edl_add_compile_fail_test(remat_unknown_name remat_unknown_name.cpp "unknown checkpoint name")
# The control: the same harness compiles a correct use (so the failures above are the asserts,
# not a broken include path).
edl_add_compile_test(compile_ok.control control_compiles.cpp)
