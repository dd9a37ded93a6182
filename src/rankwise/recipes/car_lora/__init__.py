"""CAR-LoRA (card portable-adapter.md): a plain LoRA trained over resampled compressions of its frozen base.

  compressed_base.py   CompressedBase: the base of some transformer blocks under each compression operator
                       (rankwise.quant.compression_ops), precomputed once and switched per micro-batch
  procedure.py         CarLoraProcedure, CarLoraConfig: the training procedure (`rankwise finetune --procedure car-lora`)
"""

from rankwise.recipes.car_lora.compressed_base import CompressedBase, adapted_block_indices, find_blocks

__all__ = ["CompressedBase", "adapted_block_indices", "find_blocks"]
