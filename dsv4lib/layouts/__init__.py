"""Layouts a kernel engineer can see: atoms from real CuTeDSL MMAs (traced on the CPU), the QK-accumulator →
PV-operand mappings derived by layout algebra and proven, bank-conflict counts, and matplotlib plots."""
from .kv_alias import KVAlias, kv_alias, plot_kv_alias
from .mapping import PVMapping, all_configs, physical_offsets, pv_operand_mapping, swizzle_bytes
from .tmem_plan import TmemPlan, plot_tmem_plan, tmem_plan

__all__ = ["KVAlias", "PVMapping", "TmemPlan", "all_configs", "kv_alias", "physical_offsets", "plot_kv_alias",
           "plot_tmem_plan", "pv_operand_mapping", "swizzle_bytes", "tmem_plan"]
