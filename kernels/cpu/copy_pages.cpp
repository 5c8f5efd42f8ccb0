#include "kernels/cpu/kernels_cpu.h"
