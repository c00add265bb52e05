// vector_add: out[i] = a[i] + b[i] for i < n (float32).
//   a    in   const float*  first operand, n elements
//   b    in   const float*  second operand, n elements
//   out  out  float*        sum, n elements
//   n    in   int           element count (sidecar default: "size", the block's element count)
extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ out, int n /*counts a, b, out*/)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
