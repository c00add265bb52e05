// Kernels the CPU device's tests run against NumPy (tests/unit/test_cpu_device.py) and against the GPU
// (tests/gpu/test_cpu_vs_cuda_gpu.py): shared memory, barriers, shuffles, ballots, atomics, math.
extern "C" __global__ void block_sum(const float* x, float* out, unsigned* blocks, int n) {
  __shared__ float s[256];
  int t = threadIdx.x; int i = blockIdx.x * blockDim.x + t;
  s[t] = i < n ? x[i] : 0.f;
  __syncthreads();
  for (int k = blockDim.x / 2; k >= 32; k >>= 1) { if (t < k) s[t] += s[t + k]; __syncthreads(); }
  float v = t < 32 ? s[t] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
  if (t == 0) { out[blockIdx.x] = v; atomicAdd(blocks, 1u); }
}
extern "C" __global__ void warp_ops(const int* x, int* prefix, unsigned* ballots, int* maxv, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; int lane = threadIdx.x & 31;
  int v = i < n ? x[i] : 0;
  for (int o = 1; o < 32; o <<= 1) { int u = __shfl_up_sync(0xffffffff, v, o); if (lane >= o) v += u; }
  unsigned b = __ballot_sync(0xffffffff, (i < n) && (x[i] & 1));
  if (i < n) { prefix[i] = v; atomicMax(maxv, x[i]); }
  if (lane == 0 && i < n) ballots[i / 32] = b;
}
extern "C" __global__ void math(const float* x, float* y, int* z, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { float a = x[i]; y[i] = fminf(fmaxf(a, -1.f), 1.f) * 3.f + fabsf(a) / 7.f - floorf(a);
               z[i] = ((int)(a * 100.f) >> 2) ^ (i * 3); }
}
extern "C" __global__ void quad_sums(const float* x, float* out, int n) {
  // every lane of a group of 4 sums its part, two butterflies give each lane the group's total, and every lane
  // writes it and ends: a lane that ends first must not take its value away from the lanes still reading it
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? x[i] : 0.f;
  v += __shfl_xor_sync(0xffffffff, v, 2);
  v += __shfl_xor_sync(0xffffffff, v, 1);
  if (i < n) out[i] = v;
}
