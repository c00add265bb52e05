// vector_sub: out[i] = a[i] - b[i] for i < n (float32).
// Same signature as vector_add, so the engine can swap one for the other in place (Code tier).
//   a    in   const float*  minuend, n elements
//   b    in   const float*  subtrahend, n elements
//   out  out  float*        difference, n elements
//   n    in   int           element count (sidecar default: "size")
extern "C" __global__ void vector_sub(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ out, int n /*counts a, b, out*/)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] - b[i];
}
