// Hand-written scanners equivalent to the two split regexes byte-level BPE tokenizers use.
//
//   GPT-2 (ByteLevel use_regex):
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama-3 / tiktoken cl100k (Split, Isolated):
//     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//      ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// Every code point falls in one of letter / number / whitespace / other, and each
// pattern matches at every position, so a match always starts where the previous one
// ended: scanning left to right and taking, at each position, what the first matching
// alternative (with its backtracking) would take reproduces the regex exactly, without
// a regex engine and its Unicode tables.
#include <string>

#include "model.h"

namespace tritonforge_tokenizer {
namespace {

struct DecodedText {
  std::vector<std::size_t> offsets;  // byte offset of each char, plus the end
  std::vector<char32_t> codepoints;
  std::vector<CharClass> classes;

  void Decode(std::string_view text, PatternFamily family) {
    const CharTable& table = CharTable::Get();
    offsets.clear();
    codepoints.clear();
    classes.clear();
    std::size_t i = 0;
    while (i < text.size()) {
      char32_t cp;
      const std::size_t length = DecodeUtf8(text.data(), i, &cp);
      offsets.push_back(i);
      codepoints.push_back(cp);
      classes.push_back(table.Class(family, cp));
      i += length;
    }
    offsets.push_back(text.size());
  }
};

class Emitter {
 public:
  Emitter(std::string_view text, const DecodedText& decoded, std::vector<std::string_view>* out)
      : text_(text), decoded_(decoded), out_(out) {}
  void operator()(std::size_t first_char, std::size_t end_char) const {
    const std::size_t begin = decoded_.offsets[first_char];
    out_->push_back(text_.substr(begin, decoded_.offsets[end_char] - begin));
  }

 private:
  std::string_view text_;
  const DecodedText& decoded_;
  std::vector<std::string_view>* out_;
};

// \s+(?!\S) then \s+, for a whitespace run [k, j) that contains no line break handling.
std::size_t WhitespaceEnd(std::size_t k, std::size_t j, std::size_t m) {
  // Followed by a non-space: the lookahead gives back the run's last char (if it has
  // more than one), so that char can prefix the next word.
  return (j == m || j - k == 1) ? j : j - 1;
}

// 's 't 'm 'd 're 've 'll at char k: its length in chars, else 0. `is` says whether a
// char is one of a contraction's letters (GPT-2: lower case only; cl100k: either case).
template <typename IsLetter>
std::size_t ContractionLength(const std::vector<char32_t>& cp, std::size_t k, IsLetter is) {
  const std::size_t m = cp.size();
  if (cp[k] != U'\'' || k + 1 >= m) return 0;
  const char32_t c1 = cp[k + 1];
  if (is(ContractionLetter::kSingle, c1)) return 2;
  if (k + 2 >= m) return 0;
  const char32_t c2 = cp[k + 2];
  const bool re_ve = is(ContractionLetter::kROrV, c1) && is(ContractionLetter::kE, c2);
  const bool ll = is(ContractionLetter::kL, c1) && is(ContractionLetter::kL, c2);
  return re_ve || ll ? 3 : 0;
}

bool IsGpt2ContractionLetter(ContractionLetter kind, char32_t c) {
  switch (kind) {
    case ContractionLetter::kSingle:
      return c == U's' || c == U't' || c == U'm' || c == U'd';
    case ContractionLetter::kROrV:
      return c == U'r' || c == U'v';
    case ContractionLetter::kE:
      return c == U'e';
    case ContractionLetter::kL:
      return c == U'l';
  }
  return false;
}

using Codepoints = std::vector<char32_t>;
using Classes = std::vector<CharClass>;

// Both families' frame: decode `text`, then from each piece's first char a contraction
// if one starts there, else the family's `piece` rule, which returns where the piece ends.
template <typename IsLetter, typename Piece>
void SplitPieces(std::string_view text, PatternFamily family, std::vector<std::string_view>* out,
                 IsLetter is_contraction_letter, Piece piece) {
  thread_local DecodedText d;
  d.Decode(text, family);
  const Emitter emit(text, d, out);
  std::size_t k = 0;
  while (k < d.codepoints.size()) {
    const std::size_t n = ContractionLength(d.codepoints, k, is_contraction_letter);
    const std::size_t end = n != 0 ? k + n : piece(d.codepoints, d.classes, k);
    emit(k, end);
    k = end;
  }
}

// GPT-2 after the contractions: " ?" letters, numbers or others; else whitespace.
std::size_t Gpt2Piece(const Codepoints& cp, const Classes& cls, std::size_t k) {
  const std::size_t m = cp.size();
  std::size_t first = k;
  CharClass run = cls[k];
  if (cp[k] == U' ' && k + 1 < m && cls[k + 1] != CharClass::kSpace) {
    run = cls[k + 1];  // " ?" takes the space into the letters/numbers/other run
    ++first;
  }
  if (run != CharClass::kSpace) {
    std::size_t j = first + 1;
    while (j < m && cls[j] == run) ++j;
    return j;
  }
  std::size_t j = k;
  while (j < m && cls[j] == CharClass::kSpace) ++j;
  return WhitespaceEnd(k, j, m);
}

bool IsLineBreak(char32_t c) { return c == U'\r' || c == U'\n'; }

// cl100k after the contractions (?i:'s|'t|'re|'ve|'m|'ll|'d).
std::size_t Cl100kPiece(const Codepoints& cp, const Classes& cls, std::size_t k) {
  const std::size_t m = cp.size();
  const CharClass cl = cls[k];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  std::size_t letters_from = m;
  if (cl == CharClass::kLetter) {
    letters_from = k;
  } else if (cl != CharClass::kNumber && !IsLineBreak(cp[k]) && k + 1 < m &&
             cls[k + 1] == CharClass::kLetter) {
    letters_from = k + 1;
  }
  if (letters_from < m) {
    std::size_t j = letters_from + 1;
    while (j < m && cls[j] == CharClass::kLetter) ++j;
    return j;
  }
  // \p{N}{1,3}
  if (cl == CharClass::kNumber) {
    std::size_t j = k + 1;
    while (j < m && j < k + 3 && cls[j] == CharClass::kNumber) ++j;
    return j;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  std::size_t p = k;
  if (cp[k] == U' ' && k + 1 < m && cls[k + 1] == CharClass::kOther) p = k + 1;
  if (cls[p] == CharClass::kOther) {
    std::size_t j = p + 1;
    while (j < m && cls[j] == CharClass::kOther) ++j;
    while (j < m && IsLineBreak(cp[j])) ++j;
    return j;
  }
  // Whitespace: \s*[\r\n]+ up to the run's last line break, else \s+(?!\S) | \s+.
  std::size_t j = k;
  std::size_t after_break = 0;
  while (j < m && cls[j] == CharClass::kSpace) {
    if (IsLineBreak(cp[j])) after_break = j + 1;
    ++j;
  }
  return after_break != 0 ? after_break : WhitespaceEnd(k, j, m);
}

void SplitGpt2(std::string_view text, std::vector<std::string_view>* out) {
  SplitPieces(text, PatternFamily::kGpt2, out, IsGpt2ContractionLetter, Gpt2Piece);
}

void SplitCl100k(std::string_view text, std::vector<std::string_view>* out) {
  const CharTable& table = CharTable::Get();
  const auto is = [&table](ContractionLetter kind, char32_t c) {
    return table.IsContraction(kind, c);
  };
  SplitPieces(text, PatternFamily::kCl100k, out, is, Cl100kPiece);
}

}  // namespace

void SplitByPattern(SplitPattern pattern, std::string_view text,
                    std::vector<std::string_view>* out) {
  if (pattern == SplitPattern::kGpt2) {
    SplitGpt2(text, out);
  } else {
    SplitCl100k(text, out);
  }
}

void PreTokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text,
                 PreTokenizerScratch* scratch) {
  scratch->pieces.clear();
  scratch->arena.clear();
  if (text.empty()) return;
  scratch->pieces.push_back(text);
  for (const PreTokenizerStep& step : steps) {
    scratch->next.clear();
    for (std::string_view piece : scratch->pieces) {
      if (step.kind == PreTokenizerStep::Kind::kSplit) {
        SplitByPattern(step.pattern, piece, &scratch->next);
        continue;
      }
      if (step.add_prefix_space && piece.front() != ' ') {
        scratch->arena.push_back(" " + std::string(piece));
        piece = scratch->arena.back();
      }
      if (step.use_regex) {
        SplitByPattern(SplitPattern::kGpt2, piece, &scratch->next);
      } else {
        scratch->next.push_back(piece);
      }
    }
    scratch->pieces.swap(scratch->next);
  }
}

}  // namespace tritonforge_tokenizer
