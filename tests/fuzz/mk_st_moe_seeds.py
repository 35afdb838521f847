#!/usr/bin/env python3
"""mk_st_moe_seeds.py - writes the fuzz_safetensors seeds deepseek2.bin,
glm4moe.bin and llama4.bin into tests/fuzz/seeds-safetensors/: config.json
text, a NUL byte, then a safetensors image (F32, seeded values) of a tiny
model of the class, with the tensors converter/hf.c maps for it (deepseek2's
kv_b_proj and llama4's [E, in, out] experts read transposed; a NextN layer
for deepseek2 / glm4moe). Standard library only.
Usage: tests/fuzz/mk_st_moe_seeds.py   (from the repository root)"""
import json, random, struct

def image(tensors):
    hdr, off, blobs = {}, 0, []
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        blob = struct.pack('<%df' % n, *[random.uniform(-1, 1) for _ in range(n)])
        hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(blob)]}
        off += len(blob)
        blobs.append(blob)
    h = json.dumps(hdr, separators=(',', ':')).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    return struct.pack('<Q', len(h)) + h + b''.join(blobs)

def moe_ffn(p, E, ff, n, shared, router="mlp.gate.weight"):
    t = [(p + router, [E, n]), (p + "mlp.gate.e_score_correction_bias", [E])]
    for w in ("gate", "up"):
        t += [(p + "mlp.shared_experts.%s_proj.weight" % w, [shared, n])]
    t += [(p + "mlp.shared_experts.down_proj.weight", [n, shared])]
    for e in range(E):
        t += [(p + "mlp.experts.%d.gate_proj.weight" % e, [ff, n]), (p + "mlp.experts.%d.up_proj.weight" % e, [ff, n]),
              (p + "mlp.experts.%d.down_proj.weight" % e, [n, ff])]
    return t

def dense_ffn(p, ff, n, pre="mlp."):
    return [(p + pre + "gate_proj.weight", [ff, n]), (p + pre + "up_proj.weight", [ff, n]), (p + pre + "down_proj.weight", [n, ff])]

def common(n, V):
    return [("model.embed_tokens.weight", [V, n]), ("lm_head.weight", [V, n]), ("model.norm.weight", [n])]

def deepseek2():
    n, H, ql, kl, nope, rope, v, E, ff = 8, 2, 4, 4, 4, 2, 4, 4, 4
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": n, "intermediate_size": 16, "num_hidden_layers": 2,
           "num_attention_heads": H, "num_key_value_heads": H, "vocab_size": 4, "q_lora_rank": ql, "kv_lora_rank": kl,
           "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": v, "n_routed_experts": E,
           "num_experts_per_tok": 2, "moe_intermediate_size": ff, "n_shared_experts": 1, "first_k_dense_replace": 1,
           "n_group": 2, "topk_group": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
           "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1, "max_position_embeddings": 64,
           "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32,
                            "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
    t = common(n, 4)
    for b in range(2):
        p = "model.layers.%d." % b
        t += [(p + "input_layernorm.weight", [n]), (p + "post_attention_layernorm.weight", [n]),
              (p + "self_attn.q_a_proj.weight", [ql, n]), (p + "self_attn.q_a_layernorm.weight", [ql]),
              (p + "self_attn.q_b_proj.weight", [H * (nope + rope), ql]),
              (p + "self_attn.kv_a_proj_with_mqa.weight", [kl + rope, n]), (p + "self_attn.kv_a_layernorm.weight", [kl]),
              (p + "self_attn.kv_b_proj.weight", [H * (nope + v), kl]), (p + "self_attn.o_proj.weight", [n, H * v])]
        t += dense_ffn(p, 16, n) if b == 0 else moe_ffn(p, E, ff, n, ff)
    t += [("model.layers.2.enorm.weight", [n])]
    return cfg, t

def glm4moe():
    n, H, K, hd, E, ff = 8, 2, 1, 4, 4, 4
    cfg = {"architectures": ["Glm4MoeForCausalLM"], "hidden_size": n, "intermediate_size": 16, "num_hidden_layers": 2,
           "num_attention_heads": H, "num_key_value_heads": K, "head_dim": hd, "vocab_size": 4, "n_routed_experts": E,
           "num_experts_per_tok": 2, "moe_intermediate_size": ff, "n_shared_experts": 1, "first_k_dense_replace": 1,
           "routed_scaling_factor": 2.5, "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "partial_rotary_factor": 0.5,
           "num_nextn_predict_layers": 1, "attention_bias": True, "use_qk_norm": True, "max_position_embeddings": 64}
    t = common(n, 4)
    for b in range(2):
        p = "model.layers.%d." % b
        t += [(p + "input_layernorm.weight", [n]), (p + "post_attention_layernorm.weight", [n]),
              (p + "self_attn.q_proj.weight", [H * hd, n]), (p + "self_attn.k_proj.weight", [K * hd, n]),
              (p + "self_attn.v_proj.weight", [K * hd, n]), (p + "self_attn.o_proj.weight", [n, H * hd]),
              (p + "self_attn.q_proj.bias", [H * hd]), (p + "self_attn.k_proj.bias", [K * hd]),
              (p + "self_attn.v_proj.bias", [K * hd]), (p + "self_attn.q_norm.weight", [hd]), (p + "self_attn.k_norm.weight", [hd])]
        t += dense_ffn(p, 16, n) if b == 0 else moe_ffn(p, E, ff, n, ff)
    t += [("model.layers.2.eh_proj.weight", [n, 2 * n])]
    return cfg, t

def llama4():
    n, H, K, hd, E, ff = 8, 2, 1, 4, 4, 4
    cfg = {"architectures": ["Llama4ForCausalLM"], "hidden_size": n, "intermediate_size": ff, "intermediate_size_mlp": 16,
           "num_hidden_layers": 2, "num_attention_heads": H, "num_key_value_heads": K, "head_dim": hd, "vocab_size": 4,
           "num_local_experts": E, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "use_qk_norm": True,
           "attention_chunk_size": 8192, "no_rope_layers": [1, 1], "max_position_embeddings": 64}
    t = common(n, 4)
    for b in range(2):
        p = "model.layers.%d." % b
        t += [(p + "input_layernorm.weight", [n]), (p + "post_attention_layernorm.weight", [n]),
              (p + "self_attn.q_proj.weight", [H * hd, n]), (p + "self_attn.k_proj.weight", [K * hd, n]),
              (p + "self_attn.v_proj.weight", [K * hd, n]), (p + "self_attn.o_proj.weight", [n, H * hd])]
        if b == 0:
            t += dense_ffn(p, 16, n, "feed_forward.")
        else:
            t += [(p + "feed_forward.router.weight", [E, n]), (p + "feed_forward.experts.gate_up_proj", [E, n, 2 * ff]),
                  (p + "feed_forward.experts.down_proj", [E, ff, n])]
            t += dense_ffn(p, ff, n, "feed_forward.shared_expert.")
    return cfg, t

if __name__ == '__main__':
    for name, fn, seed in (("deepseek2", deepseek2, 41), ("glm4moe", glm4moe, 42), ("llama4", llama4, 43)):
        random.seed(seed)
        cfg, t = fn()
        with open("tests/fuzz/seeds-safetensors/%s.bin" % name, "wb") as f:
            f.write(json.dumps(cfg, separators=(',', ':')).encode() + b'\0' + image(t))
