"""The tiny Llama-style transformer: the model, attention three ways, the byte tokenizer, files."""

from minillm.model.attention import attend, paged_gather, reference_attention, visible_mask
from minillm.model.checkpoint import DEFAULT_CHECKPOINT, load_model, save_checkpoint
from minillm.model.tokenizer import BOS, EOS, PAD, SEP, VOCAB_SIZE, decode, encode, encode_prompt
from minillm.model.transformer import Transformer

__all__ = ["BOS", "DEFAULT_CHECKPOINT", "EOS", "PAD", "SEP", "VOCAB_SIZE", "Transformer", "attend"]
__all__ += ["decode", "encode", "encode_prompt", "load_model", "paged_gather"]
__all__ += ["reference_attention", "save_checkpoint", "visible_mask"]
