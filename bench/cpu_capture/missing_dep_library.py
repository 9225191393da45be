"""Build a tiny causal LM from a config, save it locally, then reload it with
device_map="auto" in a venv that has transformers but not accelerate."""
import sys
import tempfile

from _steps import step_line
from transformers import AutoModelForCausalLM, GPT2Config

cfg = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=64,
                 bos_token_id=0, eos_token_id=0)
model = AutoModelForCausalLM.from_config(cfg)
for step in range(310, 314):
    step_line(step, seed=5)
path = tempfile.mkdtemp(prefix="tiny-gpt2-")
model.save_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, device_map="auto")
print("loaded", type(model).__name__, file=sys.stderr)
