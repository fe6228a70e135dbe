// UTF-8 helpers and the code point classes the pre-tokenizers and added-token matcher use.
//
// Classes come from tables generated from the installed HF `tokenizers` (not from ICU or
// PCRE2, whose Unicode versions differ), flattened once into a byte per code point so a
// lookup in the hot loop is one load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tritonforge_tokenizer {

// The four classes a GPT-2 / Llama-3 style split pattern distinguishes.
enum class CharClass : std::uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// Which pre-tokenizer's tables to use: each regex engine path in `tokenizers` is probed
// separately, so a difference between them cannot go unnoticed.
enum class PatternFamily : std::uint8_t { kGpt2 = 0, kCl100k = 1 };

// Letters the Llama-3 pattern's case-insensitive contractions accept at each position.
enum class ContractionLetter : std::uint8_t { kSingle, kROrV, kE, kL };

class CharTable {
 public:
  static const CharTable& Get();

  CharClass Class(PatternFamily family, char32_t cp) const {
    const std::uint8_t flags = flags_[cp];
    return static_cast<CharClass>(family == PatternFamily::kGpt2 ? (flags & 3) : ((flags >> 2) & 3));
  }
  bool IsWord(char32_t cp) const { return (flags_[cp] & kWordBit) != 0; }
  bool IsStripSpace(char32_t cp) const { return (flags_[cp] & kStripSpaceBit) != 0; }
  bool IsContraction(ContractionLetter which, char32_t cp) const;

 private:
  CharTable();
  static constexpr std::uint8_t kWordBit = 1 << 4;
  static constexpr std::uint8_t kStripSpaceBit = 1 << 5;
  static constexpr char32_t kCodepoints = 0x110000;
  std::uint8_t* flags_;
};

// Decodes the code point at byte offset `i` of valid UTF-8; returns its byte length.
inline std::size_t DecodeUtf8(const char* text, std::size_t i, char32_t* cp) {
  const auto* s = reinterpret_cast<const unsigned char*>(text) + i;
  if (s[0] < 0x80) {
    *cp = s[0];
    return 1;
  }
  if (s[0] < 0xE0) {
    *cp = (char32_t(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    return 2;
  }
  if (s[0] < 0xF0) {
    *cp = (char32_t(s[0] & 0x0F) << 12) | (char32_t(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return 3;
  }
  *cp = (char32_t(s[0] & 0x07) << 18) | (char32_t(s[1] & 0x3F) << 12) |
        (char32_t(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
  return 4;
}

// Byte offset where the code point ending at `end` (exclusive) starts, in valid UTF-8.
inline std::size_t PreviousCharStart(const char* text, std::size_t end) {
  std::size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) {
    --i;
  }
  return i;
}

// Result of reading one UTF-8 sequence with the "maximal subpart" rule (what Rust's
// String::from_utf8_lossy does): a valid char, an invalid run to replace with one U+FFFD,
// or a valid prefix cut off by the end of the buffer.
enum class Utf8Status { kValid, kInvalid, kIncomplete };
Utf8Status ReadUtf8(const unsigned char* s, std::size_t n, std::size_t* length);

// Offset of the first byte that is not part of valid UTF-8, or npos if all of it is.
std::size_t FindInvalidUtf8(std::string_view text);

// Appends `bytes` decoded lossily; a trailing incomplete sequence is kept in `bytes`
// when `keep_incomplete` (for streaming), replaced by U+FFFD otherwise.
void AppendLossyUtf8(std::string_view bytes, bool keep_incomplete, std::string* out,
                     std::size_t* consumed);

}  // namespace tritonforge_tokenizer
