"""The probe on multi-rank layouts: pipeline stages under Megatron Core's 1F1B schedule and a tensor-parallel group with sequence parallel."""
