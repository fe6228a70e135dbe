// tritonforge tokenizer core: HF `tokenizers`-exact byte-level BPE in C++17.
//
// One immutable Tokenizer is loaded from a HuggingFace tokenizer.json and shared by any
// number of threads (the Triton model instances, Python threads with the GIL released).
// It has no Triton or Python types in it: the Triton backend and the pybind11 module
// are thin layers over this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tritonforge_tokenizer {

using TokenId = std::uint32_t;

// Base of every error this library throws.
class TokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The tokenizer file cannot be read, is not valid JSON, or uses a component or option
// this implementation does not support (the message names it).
class LoadError : public TokenizerError {
 public:
  using TokenizerError::TokenizerError;
};

// Bad input to encode/decode: invalid UTF-8, or a token id with no token.
class InputError : public TokenizerError {
 public:
  using TokenizerError::TokenizerError;
};

class TokenizerModel;  // the loaded tables, private to the library

class Tokenizer {
 public:
  // Throws LoadError naming the file and the problem.
  static Tokenizer FromFile(const std::string& path);
  // `origin` names the source in error messages.
  static Tokenizer FromJson(std::string_view json, const std::string& origin = "<json>");

  // Token ids of `text` (UTF-8). add_special_tokens applies the post-processor's
  // BOS/EOS template, as in HF `Tokenizer.encode`. Throws InputError on invalid UTF-8.
  std::vector<TokenId> Encode(std::string_view text, bool add_special_tokens = true) const;

  // Encodes every text; uses up to `threads` threads (0: one per core) when the batch is
  // large enough to pay for them. Throws InputError naming the first bad element.
  std::vector<std::vector<TokenId>> EncodeBatch(const std::vector<std::string>& texts,
                                                bool add_special_tokens = true,
                                                unsigned threads = 0) const;

  // Text of `ids`, as HF `Tokenizer.decode`. Unlike HF (which drops them silently) an id
  // without a token throws InputError naming it: on a server that is a client bug.
  std::string Decode(const TokenId* ids, std::size_t count, bool skip_special_tokens) const;
  std::string Decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const {
    return Decode(ids.data(), ids.size(), skip_special_tokens);
  }

  // One more than the largest id of the vocabulary or an added token.
  std::size_t VocabSize() const;
  // Whether `id` has a token (ids may have gaps).
  bool HasId(TokenId id) const;
  std::optional<TokenId> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(TokenId id) const;
  bool IsSpecial(TokenId id) const;

  const std::shared_ptr<const TokenizerModel>& model() const { return model_; }

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerModel> model) : model_(std::move(model)) {}
  std::shared_ptr<const TokenizerModel> model_;
};

// Streaming detokenizer: feed ids one at a time, get text as soon as it is complete
// UTF-8. The concatenation of everything Add() and Finish() return equals
// Tokenizer::Decode of all the ids (same lossy U+FFFD replacement of invalid bytes).
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Text completed by `id` (often empty in the middle of a multi-byte character).
  // Throws InputError for an id without a token; the decoder state is then unchanged.
  std::string Add(TokenId id);
  std::string Add(const TokenId* ids, std::size_t count);
  // Flushes bytes still waiting for the rest of a character (as U+FFFD) and resets.
  std::string Finish();
  // Bytes held back waiting for the rest of a character.
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  std::shared_ptr<const TokenizerModel> model_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace tritonforge_tokenizer
