// One query token per row attending over its own span of the cache: the static engine's decode step (one new token
// after its committed entries), every row of a batch in one call, each reading only its own keys and values.
// Built once per machine by methods/engine/native.py (torch.utils.cpp_extension), float32, the last dimension
// contiguous and a multiple of 8. The order of every sum is fixed (8 lanes, then a fixed tree), so a row's result
// does not depend on the other rows of its batch or on the thread that computes it.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// exp(x) for x <= 0 (scores less their maximum): Cody-Waite range reduction, a degree-6 polynomial (Cephes' expf
// coefficients), relative error about 1e-7; written without branches so that loops over it vectorise.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline float lanes_sum(const float* a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

}  // namespace

constexpr int64_t MAX_GROUP = 16;  // query heads per K/V head
constexpr int64_t MAX_DIM = 256;   // head size

// q [R, H, D]; keys, values [rows, KV, capacity, D] (one layer of the cache, strided); row r of q reads cache row
// rows[r], slots starts[r] to ends[r] - 1. Returns [R, H, D]: query head h reads K/V head h / (H / KV). One work
// item is a row's K/V head: its keys and values are read once for the group of query heads that share them.
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor keys, torch::Tensor values, std::vector<int64_t> rows,
                               std::vector<int64_t> starts, std::vector<int64_t> ends, double scale) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1, "the head dimension must be contiguous");
  q = q.contiguous();
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), KV = keys.size(1), G = H / KV;
  TORCH_CHECK(D % 8 == 0 && D <= MAX_DIM && G <= MAX_GROUP, "head size a multiple of 8 up to 256, groups up to 16");
  auto out = torch::empty({R, H, D}, q.options());
  const float* Q = q.data_ptr<float>();
  const float* Kb = keys.data_ptr<float>();
  const float* Vb = values.data_ptr<float>();
  float* O = out.data_ptr<float>();
  const int64_t kr = keys.stride(0), kh = keys.stride(1), kl = keys.stride(2);
  const int64_t vr = values.stride(0), vh = values.stride(1), vl = values.stride(2);
  const float sc = static_cast<float>(scale);
  // Work items (a row's K/V head) shared among the threads by their spans, longest first to the least loaded
  // (rows of 40 and of 800 entries in one batch: contiguous chunks of items would leave one thread most of it).
  const int64_t items = R * KV, T = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  std::vector<int64_t> order(items), load(T, 0);
  std::vector<std::vector<int64_t>> bucket(T);
  for (int64_t i = 0; i < items; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return ends[x / KV] - starts[x / KV] > ends[y / KV] - starts[y / KV];
  });
  for (const int64_t i : order) {
    const int64_t t = std::min_element(load.begin(), load.end()) - load.begin();
    bucket[t].push_back(i);
    load[t] += ends[i / KV] - starts[i / KV] + 16;
  }
  at::parallel_for(0, T, 1, [&](int64_t first, int64_t last) {
    std::vector<float> s;  // [G, L] scores, then weights
    alignas(32) float acc[MAX_GROUP * MAX_DIM];
    for (int64_t t = first; t < last; ++t)
    for (const int64_t item : bucket[t]) {
      const int64_t r = item / KV, g = item % KV;
      const int64_t a = starts[r], L = ends[r] - a;
      s.resize(G * L);
      const float* q0 = Q + (r * H + g * G) * D;  // the group's G query heads, one after another
      const float* K = Kb + rows[r] * kr + g * kh + a * kl;
      float m[MAX_GROUP];
      for (int64_t h = 0; h < G; ++h) m[h] = -INFINITY;
      for (int64_t l = 0; l < L; ++l) {
        const float* k = K + l * kl;
        for (int64_t h = 0; h < G; ++h) {
          const float* qh = q0 + h * D;
          float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (int64_t d = 0; d < D; d += 8)
            for (int j = 0; j < 8; ++j) lane[j] += qh[d + j] * k[d + j];
          const float t = lanes_sum(lane) * sc;
          s[h * L + l] = t;
          m[h] = t > m[h] ? t : m[h];
        }
      }
      float inv[MAX_GROUP];
      for (int64_t h = 0; h < G; ++h) {
        float* sh = s.data() + h * L;
        float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t l = 0;
        for (; l + 8 <= L; l += 8)
          for (int j = 0; j < 8; ++j) {
            sh[l + j] = exp_nonpositive(sh[l + j] - m[h]);
            part[j] += sh[l + j];
          }
        for (; l < L; ++l) {
          sh[l] = exp_nonpositive(sh[l] - m[h]);
          part[l % 8] += sh[l];
        }
        inv[h] = 1.0f / lanes_sum(part);
      }
      std::memset(acc, 0, sizeof(float) * G * D);
      const float* V = Vb + rows[r] * vr + g * vh + a * vl;
      for (int64_t l = 0; l < L; ++l) {
        const float* v = V + l * vl;
        for (int64_t h = 0; h < G; ++h) {
          const float p = s[h * L + l];
          float* ah = acc + h * D;
          for (int64_t d = 0; d < D; ++d) ah[d] += p * v[d];
        }
      }
      float* o = O + (r * H + g * G) * D;
      for (int64_t h = 0; h < G; ++h)
        for (int64_t d = 0; d < D; ++d) o[h * D + d] = acc[h * D + d] * inv[h];
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "one query a row over its own span of the cache (float32)");
}
