"""Code generators: `cpp` (C++17 + OpenMP for CPUs) renders a schedule Program to source."""
