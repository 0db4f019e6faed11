// The tokenizer that a GGUF file's metadata holds (tokenizer.ggml.*), turned into the
// tokenizer.json that transformers' GGUF conversion builds from the same keys, so that it runs
// through the tokenizer.json path (tokenizer.h) and can be written beside a checkpoint for
// Hugging Face's loaders.
//
// What is read, as transformers reads it (integrations/gguf/gguf_tokenizer_mapping.py):
//  - tokenizer.ggml.model must be "gpt2": byte-level BPE. tokenizer.ggml.tokens are the vocabulary
//    (id = index); a token holding a character outside GPT-2's 256 byte characters is respelled
//    as the byte characters of its UTF-8. tokenizer.ggml.merges ("a b") are the merges in rank
//    order.
//  - tokenizer.ggml.token_type (optional): CONTROL (3) tokens become special added tokens,
//    USER_DEFINED (4) ones plain added tokens (both matched whole, before pre-tokenization),
//    each only when written in byte characters. The tokens of bos_token_id, eos_token_id,
//    unknown_token_id and padding_token_id are special added tokens too.
//  - tokenizer.ggml.pre names the pre-tokenizer: GPT-2's ByteLevel for "gpt-2" and "smollm" (and
//    when the key is absent), Llama 3's or Qwen2's Split expression before a ByteLevel without
//    its own expression for the names transformers maps to them (docs/tokenizer.md lists them).
//    Any other name is an error naming it.
// No post-processor adds tokens around a text (tokenize, training and generation add none).
// Every problem is a one-line gradaccum::Error naming the file and the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "gradaccum/formats/gguf.h"

namespace gradaccum::data {

// The tokenizer.json of `file`'s tokenizer.
nlohmann::json gguf_tokenizer_json(const formats::GgufFile& file);

// Writes a tokenizer.json object to `path` atomically (a temporary file fsynced and renamed).
void write_tokenizer_json(const std::string& path, const nlohmann::json& tokenizer);

}  // namespace gradaccum::data
