// edl_fuzz_index: model.safetensors.index.json text, opened beside two valid shards (tensor "a"
// in model-00001-of-00002.safetensors, "b" in model-00002-of-00002.safetensors); every tensor
// the index yields is read.
#include <edl/io/safetensors.hpp>

#include "fuzz_target.hpp"

namespace {

const std::filesystem::path& folder() {
  static const std::filesystem::path dir = [] {
    const auto d = edl::fuzz::scratch_dir() / "index";
    std::filesystem::create_directories(d);
    const std::vector<float> a = {1.f, 2.f}, b = {3.f, 4.f, 5.f};
    edl::io::save_safetensors((d / "model-00001-of-00002.safetensors").string(), {{"a", edl::io::TensorRef(a, {2})}});
    edl::io::save_safetensors((d / "model-00002-of-00002.safetensors").string(), {{"b", edl::io::TensorRef(b, {3})}});
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto index = folder() / "model.safetensors.index.json";
  edl::fuzz::write_file(index, edl::fuzz::text_of(data, size));
  edl::fuzz::expect_load_or_error([&] {
    const auto c = edl::io::ShardedCheckpoint::open(index.string());
    for (const auto& name : c.names()) (void)c.read_f32(name);
  });
  return 0;
}
