#include <cuda_runtime.h>
// rxcuda's built-in kernels: the condition kernels of regions and GPU-driven frames (each sets a conditional
// node's handle through the device runtime) and the profiling timestamp.
__device__ __forceinline__ bool rx_flag(const void* p, unsigned size) {
    if (!p) return true;
    switch (size) {
        case 1: return *(const unsigned char*)p != 0;
        case 2: return *(const unsigned short*)p != 0;
        case 8: return *(const unsigned long long*)p != 0ull;
        default: return *(const unsigned int*)p != 0u;
    }
}
extern "C" __global__ void rx_cond_set(cudaGraphConditionalHandle h, const void* flag, unsigned size, unsigned invert) {
    bool v = rx_flag(flag, size);
    cudaGraphSetConditional(h, (invert ? !v : v) ? 1u : 0u);
}
extern "C" __global__ void rx_loop_init(cudaGraphConditionalHandle h, unsigned* counter, unsigned n,
                                        const void* flag, unsigned size, unsigned invert) {
    *counter = n;
    bool v = flag ? rx_flag(flag, size) != (invert != 0) : true;
    cudaGraphSetConditional(h, (n > 0u && v) ? 1u : 0u);
}
extern "C" __global__ void rx_loop_step(cudaGraphConditionalHandle h, unsigned* counter,
                                        const void* flag, unsigned size, unsigned invert) {
    unsigned c = *counter - 1u;
    *counter = c;
    bool v = flag ? rx_flag(flag, size) != (invert != 0) : true;
    cudaGraphSetConditional(h, (c > 0u && v) ? 1u : 0u);
}
// A timestamp for profiling: the GPU's global timer (ns) into column `column` of row (frame % slots) of a ring
// in host-mapped memory. Column 0 is the frame's start stamp, which runs before everything else in the frame
// and counts the frames in `frames`; every other stamp runs after it and reads the count.
extern "C" __global__ void rx_stamp(unsigned long long* ring, unsigned* frames, unsigned slots, unsigned width,
                                    unsigned column) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    unsigned frame;
    if (column == 0) { frame = *frames; *frames = frame + 1; } else { frame = *frames - 1; }
    ring[(unsigned long long)(frame % slots) * width + column] = t;
}
