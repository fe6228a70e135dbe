#include "unicode.h"

#include <algorithm>
#include <string>

#include "unicode_tables.h"

namespace tritonforge_tokenizer {
namespace {

namespace ut = unicode_tables;

void Mark(std::uint8_t* flags, const ut::CodepointRange* ranges, std::size_t count,
          std::uint8_t value, std::uint8_t shift) {
  for (std::size_t r = 0; r < count; ++r) {
    for (std::uint32_t cp = ranges[r].first; cp <= ranges[r].last; ++cp) {
      flags[cp] = static_cast<std::uint8_t>(flags[cp] | (value << shift));
    }
  }
}

bool InRanges(const ut::CodepointRange* ranges, std::size_t count, char32_t cp) {
  const ut::CodepointRange* end = ranges + count;
  const auto* it = std::upper_bound(
      ranges, end, cp, [](char32_t value, const ut::CodepointRange& r) { return value < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

}  // namespace

CharTable::CharTable() : flags_(new std::uint8_t[kCodepoints]()) {
  Mark(flags_, ut::gpt2_letter, ut::gpt2_letter_size, 1, 0);
  Mark(flags_, ut::gpt2_number, ut::gpt2_number_size, 2, 0);
  Mark(flags_, ut::gpt2_space, ut::gpt2_space_size, 3, 0);
  Mark(flags_, ut::cl100k_letter, ut::cl100k_letter_size, 1, 2);
  Mark(flags_, ut::cl100k_number, ut::cl100k_number_size, 2, 2);
  Mark(flags_, ut::cl100k_space, ut::cl100k_space_size, 3, 2);
  Mark(flags_, ut::added_word, ut::added_word_size, 1, 4);
  Mark(flags_, ut::added_strip_space, ut::added_strip_space_size, 1, 5);
}

const CharTable& CharTable::Get() {
  // Built once per process (1.1 MB) and never freed: it is shared by every tokenizer.
  static const CharTable* table = new CharTable();
  return *table;
}

bool CharTable::IsContraction(ContractionLetter which, char32_t cp) const {
  switch (which) {
    case ContractionLetter::kSingle:
      return InRanges(ut::cl100k_contraction_single, ut::cl100k_contraction_single_size, cp);
    case ContractionLetter::kROrV:
      return InRanges(ut::cl100k_contraction_r_or_v, ut::cl100k_contraction_r_or_v_size, cp);
    case ContractionLetter::kE:
      return InRanges(ut::cl100k_contraction_e, ut::cl100k_contraction_e_size, cp);
    case ContractionLetter::kL:
      return InRanges(ut::cl100k_contraction_l, ut::cl100k_contraction_l_size, cp);
  }
  return false;
}

Utf8Status ReadUtf8(const unsigned char* s, std::size_t n, std::size_t* length) {
  const unsigned char lead = s[0];
  if (lead < 0x80) {
    *length = 1;
    return Utf8Status::kValid;
  }
  std::size_t need;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    *length = 1;
    return Utf8Status::kInvalid;
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (k >= n) {
      *length = k;
      return Utf8Status::kIncomplete;
    }
    const unsigned char byte = s[k];
    const unsigned char min = k == 1 ? lo : 0x80;
    const unsigned char max = k == 1 ? hi : 0xBF;
    if (byte < min || byte > max) {
      *length = k;
      return Utf8Status::kInvalid;
    }
  }
  *length = need + 1;
  return Utf8Status::kValid;
}

std::size_t FindInvalidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    if (ReadUtf8(s + i, n - i, &length) != Utf8Status::kValid) {
      return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

void AppendLossyUtf8(std::string_view bytes, bool keep_incomplete, std::string* out,
                     std::size_t* consumed) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  std::size_t valid_from = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    const Utf8Status status = ReadUtf8(s + i, n - i, &length);
    if (status == Utf8Status::kValid) {
      i += length;
      continue;
    }
    out->append(bytes.data() + valid_from, i - valid_from);
    if (status == Utf8Status::kIncomplete && keep_incomplete) {
      *consumed = i;
      return;
    }
    out->append(kReplacement, 3);
    i += length;
    valid_from = i;
  }
  out->append(bytes.data() + valid_from, n - valid_from);
  *consumed = n;
}

}  // namespace tritonforge_tokenizer
