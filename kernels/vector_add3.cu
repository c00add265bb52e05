// vector_add3: out[i] = a[i] + b[i] + c[i] for i < n (float32).
// One more pointer than vector_add: swapping it in for vector_add changes the signature and forces a
// rebuild of the block (Structure tier).
//   a    in   const float*  first operand, n elements
//   b    in   const float*  second operand, n elements
//   c    in   const float*  third operand, n elements
//   out  out  float*        sum, n elements
//   n    in   int           element count (sidecar default: "size")
extern "C" __global__ void vector_add3(const float* __restrict__ a, const float* __restrict__ b,
                                       const float* __restrict__ c, float* __restrict__ out, int n /*counts a, b, c, out*/)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i] + c[i];
}
