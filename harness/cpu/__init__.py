"""Run real Megatron Core model code on CPU: the narrow CUDA adapter and tiny style models."""
