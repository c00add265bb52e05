// append_above: append every values[i] > threshold (i < n) to out, in no particular order (float32).
// An append output: count is a u32 counter the engine zeroes each frame before this kernel runs; after it
// runs, count holds how many values passed, which may exceed capacity (only the first capacity are kept).
//   values     in       const float*   input, n elements
//   out        out      float*         appended values, capacity elements (the append data)
//   count      counter  unsigned int*  append counter, 1 element
//   threshold  in       float          keep values above this (sidecar default: 0.0)
//   capacity   in       unsigned int   elements out can hold (sidecar default: "size")
//   n          in       int            element count of values (sidecar default: "size")
extern "C" __global__ void append_above(const float* __restrict__ values, float* __restrict__ out,
                                        unsigned int* __restrict__ count, float threshold,
                                        unsigned int capacity /*counts out*/, int n /*counts values*/)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = values[i];
        if (v > threshold) {
            unsigned int j = atomicAdd(count, 1u);
            if (j < capacity) out[j] = v;
        }
    }
}
