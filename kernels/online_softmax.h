// The online-softmax state of one query row over a set of keys, and the merge of two states
// (split-KV), shared by the CPU and CUDA kernels.
//
// For scores s_j and value rows v_j, a state holds m = max_j s_j, l = Σ_j exp(s_j − m) and
// acc = Σ_j exp(s_j − m) · v_j; the attention output is acc / l. Adding a key rescales by
// exp(m_old − m_new); merging two states rescales each to the larger max. An empty state has
// m = −inf, l = 0, acc = 0 and is the identity of merge.
#pragma once

#include <cmath>

#include "kernels/host_device.h"

namespace kvpool::kernels {

struct SoftmaxStats {
  float m = -INFINITY;
  float l = 0.0f;
};

// Takes score s into (stats, acc[0..d)) with value row v (already converted to fp32).
KVPOOL_HD void softmax_add(SoftmaxStats& st, float* acc, const float* v, int d, float s) {
  const float m_new = s > st.m ? s : st.m;
  const float corr = expf(st.m - m_new);  // exp(−inf) = 0 for the empty state
  const float p = expf(s - m_new);
  st.l = st.l * corr + p;
  for (int i = 0; i < d; ++i)
    acc[i] = acc[i] * corr + p * v[i];
  st.m = m_new;
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
  const float ca = expf(a.m - m);
  const float cb = expf(b.m - m);
  a.l = a.l * ca + b.l * cb;
  for (int i = 0; i < d; ++i)
    acc_a[i] = acc_a[i] * ca + acc_b[i] * cb;
  a.m = m;
}

}  // namespace kvpool::kernels
