// edl/lora/all.hpp: LoRA / QLoRA adapters (config, apply / merge / unwrap, PEFT folders).
// Guide: docs/lora.md.
#pragma once
#include <edl/lora/apply.hpp>
#include <edl/lora/config.hpp>
#include <edl/lora/peft.hpp>
