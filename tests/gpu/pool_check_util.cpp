#include "tests/gpu/pool_check_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#ifdef KVPOOL_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvpool::gpu_check {

namespace {

float kv_value(uint32_t layer, uint32_t token, uint32_t head, uint32_t d, uint32_t kv) {
  uint64_t x = (uint64_t{layer} << 48) ^ (uint64_t{token} << 24) ^ (uint64_t{head} << 16) ^
               (uint64_t{d} << 2) ^ kv;
  x = (x ^ (x >> 31)) * 0x7fb5d329728ea185ull;
  x = (x ^ (x >> 27)) * 0x81dadef4bc2dd44dull;
  return static_cast<float>(static_cast<double>(x >> 40) / double(1 << 24) * 2.0 - 1.0);
}

// Host arrays handed to a kernel: as they are for a host pool, copied to device memory (and
// freed on destruction) for a GPU pool.
class Staging {
 public:
  explicit Staging(bool device) : device_(device) {}
  ~Staging() {
#ifdef KVPOOL_WITH_CUDA
    for (void* p : owned_)
      cudaFree(p);
#endif
  }
  template <typename T>
  T* put(std::vector<T>& host) {
    if (!device_) return host.data();
#ifdef KVPOOL_WITH_CUDA
    void* d = nullptr;
    if (cudaMalloc(&d, host.size() * sizeof(T)) != cudaSuccess) return nullptr;
    owned_.push_back(d);
    cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return static_cast<T*>(d);
#else
    return nullptr;
#endif
  }
  // Back to the host after the kernels on the default stream finished.
  template <typename T>
  void get(std::vector<T>& host, const T* src) {
    if (!device_) return;
#ifdef KVPOOL_WITH_CUDA
    cudaMemcpy(host.data(), src, host.size() * sizeof(T), cudaMemcpyDeviceToHost);
#else
    (void)host;
    (void)src;
#endif
  }

 private:
  bool device_;
  std::vector<void*> owned_;
};

}  // namespace

std::string pool_config(const std::string& backend, const std::string& dtype,
                        const std::string& extra) {
  return "backend: " + backend + "\n" + extra +
         "pools:\n  - name: default\n    geometry: {layers: 2, kv_heads: 8, head_dim: 128, "
         "tokens_per_page: 16, dtype: " +
         dtype + "}\n    capacity: 256 pages\n";
}

BlockHash prompt_hash(uint32_t block) {
  return BlockHash{0x5000 + uint64_t{block}, 0xabcdefull * (block + 1)};
}

std::string append_prompt(client::PoolKernels& k, const std::vector<PageId>& pages,
                          uint32_t first_page_token, uint32_t first, uint32_t last) {
  const uint32_t n = last - first;
  std::vector<float> kk(size_t{n} * kKvHeads * kHeadDim);
  std::vector<float> vv(kk.size());
  std::vector<int64_t> slots(n);
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t t = first + i;
      const uint32_t rel = t - first_page_token;
      slots[i] = int64_t{pages[rel / kTokensPerPage]} * kTokensPerPage + rel % kTokensPerPage;
      for (uint32_t h = 0; h < kKvHeads; ++h) {
        for (uint32_t d = 0; d < kHeadDim; ++d) {
          kk[(size_t{i} * kKvHeads + h) * kHeadDim + d] = kv_value(layer, t, h, d, 0);
          vv[(size_t{i} * kKvHeads + h) * kHeadDim + d] = kv_value(layer, t, h, d, 1);
        }
      }
    }
    Staging st(k.on_device());
    kernels::AppendArgs a;
    a.layer = layer;
    a.num_tokens = n;
    a.k = st.put(kk);
    a.v = st.put(vv);
    a.slots = st.put(slots);
    if (a.k == nullptr || a.v == nullptr || a.slots == nullptr) return "staging failed";
    if (std::string err = k.append_kv(a); !err.empty()) return err;
#ifdef KVPOOL_WITH_CUDA
    if (k.on_device() && cudaDeviceSynchronize() != cudaSuccess) return "append_kv failed";
#endif
  }
  return "";
}

std::vector<float> decode_prompt(client::PoolKernels& k, const std::vector<PageId>& table,
                                 std::string& err) {
  std::vector<float> q(size_t{kQHeads} * kHeadDim);
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = std::sin(0.37f * static_cast<float>(i));
  std::vector<float> out(kLayers * q.size());
  std::vector<PageId> tab = table;
  std::vector<uint32_t> context = {kPromptTokens};
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    Staging st(k.on_device());
    std::vector<float> o(q.size());
    kernels::DecodeArgs a;
    a.layer = layer;
    a.num_seqs = 1;
    a.num_q_heads = kQHeads;
    a.q = st.put(q);
    a.out = st.put(o);
    a.block_tables = st.put(tab);
    a.block_table_stride = static_cast<uint32_t>(tab.size());
    a.context_lens = st.put(context);
    a.scale = 1.0f / std::sqrt(float(kHeadDim));
    a.split_tokens = 32;  // several chunks: the split path and its merge
    err = k.decode(a, kPromptTokens);
    if (!err.empty()) return {};
    st.get(o, a.out);
    std::copy(o.begin(), o.end(), out.begin() + static_cast<std::ptrdiff_t>(layer * q.size()));
  }
  return out;
}

std::vector<std::byte> page_image(const client::Connection& c, PageId p) {
  const uint64_t data = page_data_bytes(c.pool().geometry);
  const uint64_t scales = page_scale_bytes(c.pool().geometry);
  std::vector<std::byte> b(data + scales);
  const float* s = c.page_scales(p);
  if (c.device() < 0) {
    std::memcpy(b.data(), c.page(p), data);
    if (s != nullptr) std::memcpy(b.data() + data, s, scales);
    return b;
  }
#ifdef KVPOOL_WITH_CUDA
  cudaMemcpy(b.data(), c.page(p), data, cudaMemcpyDeviceToHost);
  if (s != nullptr) cudaMemcpy(b.data() + data, s, scales, cudaMemcpyDeviceToHost);
#endif
  return b;
}

int report(int code, const std::string& what) {
  std::fprintf(stderr, "  worker: %s\n", what.c_str());
  return code;
}

int publish_prompt(const std::string& socket, bool release) {
  auto c = client::Connection::attach(socket, "worker-a");
  if (!c.ok()) return report(1, c.error().message);
  client::PoolKernels k(*c.value());
  auto pages = c.value()->alloc(kFullPages + 1);
  if (!pages.ok()) return report(2, pages.error().message);
  if (std::string err = append_prompt(k, pages.value(), 0, kPromptTokens); !err.empty())
    return report(3, err);
  std::vector<PublishItem> items;
  for (uint32_t i = 0; i < kFullPages; ++i)
    items.push_back({pages.value()[i], prompt_hash(i)});
  if (!c.value()->publish(items).ok()) return report(4, "publish failed");
  if (release && !c.value()->release(pages.value()).ok()) return report(5, "release failed");
  return 0;
}

int check_reused_prompt(client::Connection& conn, const std::vector<PageId>& found) {
  client::PoolKernels k(conn);
  auto tail = conn.alloc(1);
  auto own = conn.alloc(kFullPages + 1);
  if (!tail.ok() || !own.ok()) return report(3, "alloc failed");
  std::string err = append_prompt(k, tail.value(), kFullPages * kTokensPerPage, kPromptTokens);
  if (err.empty()) err = append_prompt(k, own.value(), 0, kPromptTokens);
  if (!err.empty()) return report(4, err);
  for (uint32_t i = 0; i < kFullPages; ++i) {
    if (page_image(conn, found[i]) != page_image(conn, own.value()[i]))
      return report(5, "a reused page differs from the recomputed one");
  }
  std::vector<PageId> table = found;
  table.push_back(tail.value()[0]);
  const auto shared = decode_prompt(k, table, err);
  const auto mine = decode_prompt(k, own.value(), err);
  if (!err.empty()) return report(6, err);
  if (shared.empty() || shared != mine) return report(7, "decode over shared pages differs");
  for (float x : shared) {
    if (!std::isfinite(x)) return report(8, "decode output is not finite");
  }
  return 0;
}

}  // namespace kvpool::gpu_check
