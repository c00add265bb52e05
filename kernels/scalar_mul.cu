// scalar_mul: out[i] = x[i] * scale for i < n (float32).
//   x      in   const float*  input, n elements
//   out    out  float*        scaled input, n elements
//   scale  in   float         factor (sidecar default: 1.0)
//   n      in   int           element count (sidecar default: "size")
extern "C" __global__ void scalar_mul(const float* __restrict__ x, float* __restrict__ out, float scale, int n /*counts x, out*/)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * scale;
}
