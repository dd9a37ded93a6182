"""`rankwise audit`: read any PEFT LoRA folder and say what it changes (`weight_space`), from `lora_folder`'s reading,
collected into one `report.Audit`."""
