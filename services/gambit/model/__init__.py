"""Llama-family models in Hugging Face layout."""

from gambit.model.config import ModelConfig
from gambit.model.llama import CausalLM, causal_attention
from gambit.model.loader import load_model, save_model
from gambit.model.tokenizer import Tokenizer, build_char_tokenizer

__all__ = ["CausalLM", "ModelConfig", "Tokenizer", "build_char_tokenizer", "causal_attention",
           "load_model", "save_model"]
