// saxpy: y_out[i] = a * x[i] + y[i] for i < n (float32).
//   x      in   const float*  n elements
//   y      in   const float*  n elements
//   y_out  out  float*        n elements (may be the same buffer as y)
//   a      in   float         factor (sidecar default: 1.0)
//   n      in   int           element count (sidecar default: "size")
extern "C" __global__ void saxpy(const float* x, const float* y, float* y_out, float a, int n /*counts x, y, y_out*/)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_out[i] = a * x[i] + y[i];
}
