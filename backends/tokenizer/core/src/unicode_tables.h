// Declarations of the generated code point tables (see scripts/gen_unicode_tables.py).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tritonforge_tokenizer::unicode_tables {

struct CodepointRange {
  std::uint32_t first;
  std::uint32_t last;  // inclusive
};

#define TRITONFORGE_TABLE(name)               \
  extern const CodepointRange* const name;    \
  extern const std::size_t name##_size

TRITONFORGE_TABLE(gpt2_letter);
TRITONFORGE_TABLE(gpt2_number);
TRITONFORGE_TABLE(gpt2_space);
TRITONFORGE_TABLE(cl100k_letter);
TRITONFORGE_TABLE(cl100k_number);
TRITONFORGE_TABLE(cl100k_space);
TRITONFORGE_TABLE(cl100k_contraction_single);
TRITONFORGE_TABLE(cl100k_contraction_r_or_v);
TRITONFORGE_TABLE(cl100k_contraction_e);
TRITONFORGE_TABLE(cl100k_contraction_l);
TRITONFORGE_TABLE(added_word);
TRITONFORGE_TABLE(added_strip_space);

#undef TRITONFORGE_TABLE

}  // namespace tritonforge_tokenizer::unicode_tables
