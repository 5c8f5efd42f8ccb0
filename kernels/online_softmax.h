// The online-softmax state of one query row over a set of keys, its update by one key or a block
// of keys, and the merge of two states (split-KV, lane groups, warps), shared by the CPU and CUDA
// kernels: the CPU decode and both CUDA attention kernels take blocks of scores with
// softmax_block_scores and merge with softmax_merge; the CPU extend adds keys one at a time.
//
// For scores s_j and value rows v_j, a state holds m = max_j s_j, l = Σ_j exp(s_j − m) and
// acc = Σ_j exp(s_j − m) · v_j; the attention output is acc / l. Adding a key rescales by
// exp(m_old − m_new); merging two states rescales each to the larger max. An empty state has
// m = −inf, l = 0, acc = 0 and is the identity of merge.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace kvpool::kernels {

// e^x for the softmax: expf on the host; on the device __expf (ex2.approx of x · log2 e, a
// relative error of a few 2^-23 plus |x| · 2^-24, which only the tiny weights of far-below-max
// scores see), several times cheaper than expf there. exp(−inf) = 0 and NaN stays NaN on both.
KVPOOL_HD float softmax_exp(float x) {
#if defined(__CUDA_ARCH__)
  return __expf(x);
#else
  return expf(x);
#endif
}

struct SoftmaxStats {
  float m = -INFINITY;
  float l = 0.0f;
};

// Takes score s into (stats, acc[0..d)) with value row v (already converted to fp32).
KVPOOL_HD void softmax_add(SoftmaxStats& st, float* acc, const float* v, int d, float s) {
  const float m_new = s > st.m ? s : st.m;
  const float corr = softmax_exp(st.m - m_new);  // exp(−inf) = 0 for the empty state
  const float p = softmax_exp(s - m_new);
  st.l = st.l * corr + p;
  for (int i = 0; i < d; ++i)
    acc[i] = acc[i] * corr + p * v[i];
  st.m = m_new;
}

// Takes a block of n scores s[0..n) into st at once: the max is taken over the whole block, so
// the running state is rescaled once per block instead of once per key. On return s[j] holds
// p_j = exp(s_j − m_new), st holds m_new = max(m_old, max_j s_j) and l = l·corr + Σ_j p_j, and
// the returned corr = exp(m_old − m_new) is the factor the caller must apply to its accumulator
// before adding Σ_j p_j · v_j (softmax_add_block does both). Same math as n calls of softmax_add,
// up to rounding. A block of only −inf scores leaves the state unchanged (p_j = 0, corr = 1);
// a NaN score makes the state NaN, as with softmax_add.
KVPOOL_HD float softmax_block_scores(SoftmaxStats& st, float* s, int n) {
  float m_new = st.m;
  for (int j = 0; j < n; ++j)
    m_new = s[j] > m_new ? s[j] : m_new;
  if (m_new == -INFINITY) {  // every score −inf or NaN: no weight, but a NaN still propagates
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) {
      s[j] = s[j] == -INFINITY ? 0.0f : s[j];
      sum += s[j];
    }
    st.l += sum;
    return 1.0f;
  }
  const float corr = softmax_exp(st.m - m_new);  // exp(−inf) = 0 for the empty state
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    s[j] = softmax_exp(s[j] - m_new);
    sum += s[j];
  }
  st.l = st.l * corr + sum;
  st.m = m_new;
  return corr;
}

// Takes the n scores s[0..n) (overwritten with their p_j) and value rows v + j · v_stride
// (fp32, d elements each) into (st, acc[0..d)): softmax_add for a whole block of keys.
KVPOOL_HD void softmax_add_block(SoftmaxStats& st, float* acc, const float* v, int64_t v_stride,
                                 int d, float* s, int n) {
  const float corr = softmax_block_scores(st, s, n);
  for (int i = 0; i < d; ++i)
    acc[i] *= corr;
  for (int j = 0; j < n; ++j) {
    const float p = s[j];
    const float* vj = v + j * v_stride;
    for (int i = 0; i < d; ++i)
      acc[i] += p * vj[i];
  }
}

// Merges (b, acc_b) into (a, acc_a).
KVPOOL_HD void softmax_merge(SoftmaxStats& a, float* acc_a, const SoftmaxStats& b,
                             const float* acc_b, int d) {
  if (b.l == 0.0f) return;
  if (a.l == 0.0f) {
    a = b;
    for (int i = 0; i < d; ++i)
      acc_a[i] = acc_b[i];
    return;
  }
  const float m = a.m > b.m ? a.m : b.m;
  const float ca = softmax_exp(a.m - m);
  const float cb = softmax_exp(b.m - m);
  a.l = a.l * ca + b.l * cb;
  for (int i = 0; i < d; ++i)
    acc_a[i] = acc_a[i] * ca + acc_b[i] * cb;
  a.m = m;
}

}  // namespace kvpool::kernels
