"""Code generators: `cpp` (C++17 + OpenMP for CPUs) and `triton` (GPUs; CPU tensors through
Triton's interpreter) render a schedule Program to source."""
