// minivllm's CPU kernels as one Python module (minivllm/cpu_kernels.py builds and loads it).
//
// The kernels are in headers and this is the one translation unit that compiles them: most of a
// build is spent in torch's own headers, so one unit builds in about half the time of three.

#include <torch/extension.h>

#include "layer_ops_cpu.h"
#include "paged_attention_cpu.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "PagedAttention over a paged KV cache, read in place");
  m.def("rms_norm", &rms_norm, "RMSNorm of each row, float32");
  m.def("rotary_", &rotary_, "rotary embeddings of [T, heads, head_dim], in place, float32");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up, float32");
}
