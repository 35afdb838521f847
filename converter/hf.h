/* hf.h - a Hugging Face folder (config.json + safetensors) presented to the
 * converter as a GGUF-like model: llama.cpp's metadata keys and tensor names,
 * tensors read from the shards through converter/safetensors (docs/safetensors.md).
 *
 * Owns: config.json per architecture class, HF tensor names -> llama.cpp's,
 * the llama-family q/k row permutation, per-expert tensors stacked, Gemma's
 * norm + 1, 1-D tensors as F32 (as llama.cpp's convert_hf_to_gguf.py writes them),
 * gpt-oss's shared expert tensors (gate/up rows de-interleaved, MXFP4 blocks
 * re-laid into ggml's block_mxfp4, bytes unchanged), and the shape checks of
 * every tensor against config.json.
 * Must not know: the .jlm format (converter/convert.c plans from the handle).
 * Refusals name the file and the class, key, tensor or dtype.
 */
#ifndef JLM_HF_H
#define JLM_HF_H

#include "converter/gguf.h"

#include <stdio.h>

/* 1 if path is a folder holding config.json with model.safetensors or its
 * index, or tokenizer.json, and no model.jlm (a jlmfs view is not a source). */
int jlm_hf_is_folder(const char *path);

/* Opens the folder as a virtual GGUF handle (close with jlm_gguf_close). A
 * folder with tokenizer files and no config.json gives a vocab-only handle.
 * Notes (what is accepted but not applied) go to notes if non-NULL. */
int jlm_hf_open(const char *dir, FILE *notes, jlm_gguf **out, jlm_err *err);
/* The same for the folder rel below the directory root_fd (root_fd < 0: rel
 * is a plain path, as jlm_hf_open): every file of it opened below root_fd,
 * following no symlink (base/beneath.h), as the daemon opens sources. */
int jlm_hf_open_at(int root_fd, const char *rel, FILE *notes, jlm_gguf **out, jlm_err *err);
/* jlm_hf_is_folder for rel below root_fd, no symlink followed. */
int jlm_hf_is_folder_at(int root_fd, const char *rel);

/* The same from a config.json text and one in-memory safetensors image
 * (which outlives the handle). For fuzzing and crafted-input tests. */
int jlm_hf_open_mem(const char *config, size_t config_len, const void *st, size_t st_len,
                    jlm_gguf **out, jlm_err *err);

/* A vocab-only handle from an in-memory tokenizer.json. For fuzzing. */
int jlm_hf_open_tok_mem(const char *tok, size_t tok_len, jlm_gguf **out, jlm_err *err);

#endif
