// Internal representation of a loaded tokenizer.json (not part of the public API).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tritonforge_tokenizer/tokenizer.h"
#include "unicode.h"

namespace tritonforge_tokenizer {

// ---- Added tokens --------------------------------------------------------------------

struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

// A piece of the input: a byte range, and the added token it is, if any.
struct Segment {
  std::size_t begin;
  std::size_t end;
  const AddedToken* token;  // nullptr: ordinary text for the pre-tokenizer and model
};

// Leftmost-longest matcher over a set of added tokens (a byte trie), applying the
// single_word / lstrip / rstrip rules the way `tokenizers`' AddedVocabulary does.
class AddedTokenMatcher {
 public:
  void Build(std::vector<const AddedToken*> tokens);
  bool empty() const { return tokens_.empty(); }
  // Splits text[begin, end) into segments covering it; appends to `out`.
  void Split(std::string_view text, std::size_t begin, std::size_t end,
             std::vector<Segment>* out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::int32_t>> children;  // sorted by byte
    std::int32_t token = -1;
  };
  std::int32_t Child(std::int32_t node, unsigned char byte) const;
  std::vector<Node> nodes_;
  std::array<std::int32_t, 256> root_children_{};
  std::vector<const AddedToken*> tokens_;
};

// ---- Pre-tokenizer -------------------------------------------------------------------

enum class SplitPattern : std::uint8_t { kGpt2, kCl100k };

struct PreTokenizerStep {
  enum class Kind : std::uint8_t { kSplit, kByteLevel } kind;
  SplitPattern pattern = SplitPattern::kGpt2;  // kSplit, or kByteLevel with use_regex
  bool add_prefix_space = false;               // kByteLevel
  bool use_regex = false;                      // kByteLevel
};

// Pieces are views into the input or into `arena` (for pieces given a prefix space).
struct PreTokenizerScratch {
  std::vector<std::string_view> pieces;
  std::vector<std::string_view> next;
  std::deque<std::string> arena;
};

void PreTokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text,
                 PreTokenizerScratch* scratch);

// Appends the byte lengths of the pieces `pattern` cuts `text` into (exposed for tests).
void SplitByPattern(SplitPattern pattern, std::string_view text,
                    std::vector<std::string_view>* out);

// ---- BPE model -----------------------------------------------------------------------

struct BpeModel {
  std::unordered_map<std::string, TokenId> vocab;      // byte-level token string -> id
  std::unordered_map<std::string, TokenId> raw_vocab;  // raw bytes -> id (ignore_merges)
  std::array<std::int64_t, 256> byte_ids{};            // id of each byte's symbol, -1: none
  // (left id << 32 | right id) -> (rank << 32 | merged id)
  std::unordered_map<std::uint64_t, std::uint64_t> merges;
  bool ignore_merges = false;
  bool has_unk = false;
  bool fuse_unk = false;
  TokenId unk_id = 0;

  void Tokenize(std::string_view piece, std::vector<TokenId>* out) const;
};

// ---- Whole tokenizer -----------------------------------------------------------------

class TokenizerModel {
 public:
  std::string origin;
  BpeModel bpe;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::deque<AddedToken> added_tokens;  // stable addresses
  AddedTokenMatcher raw_matcher;         // normalized == false, matched on the input
  AddedTokenMatcher normalized_matcher;  // normalized == true (no normalizer: same text)
  std::vector<TokenId> prefix_ids;       // post-processor, single sequence
  std::vector<TokenId> suffix_ids;

  // Per id: decoded bytes, whether it exists, whether it is special.
  std::vector<std::string> id_bytes;
  std::vector<std::string> id_token;
  std::vector<std::uint8_t> id_flags;
  static constexpr std::uint8_t kIdExists = 1;
  static constexpr std::uint8_t kIdSpecial = 2;
  std::unordered_map<std::string, TokenId> token_to_id;  // added tokens first, then vocab

  void EncodeInto(std::string_view text, bool add_special_tokens,
                  std::vector<TokenId>* ids) const;
  // Appends the decoded bytes of one id (nothing for a skipped special token).
  void AppendIdBytes(TokenId id, bool skip_special_tokens, std::string* out) const;
};

// Parses tokenizer.json text; throws LoadError.
std::shared_ptr<TokenizerModel> LoadTokenizerModel(std::string_view json,
                                                   const std::string& origin);

// The 256-symbol byte-level alphabet of GPT-2: byte -> code point, and back.
char32_t ByteToUnicode(unsigned char byte);
// -1 if the code point is not in the alphabet.
int UnicodeToByte(char32_t cp);

}  // namespace tritonforge_tokenizer
