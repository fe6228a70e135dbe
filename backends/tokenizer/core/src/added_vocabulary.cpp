// Added-token splitting with the semantics of `tokenizers`' AddedVocabulary: all
// leftmost-longest matches are found first, then each is kept or dropped (single_word)
// and widened over whitespace (lstrip / rstrip), a widened match never reaching back
// into the previous one.
#include <algorithm>

#include "model.h"

namespace tritonforge_tokenizer {

void AddedTokenMatcher::Build(std::vector<const AddedToken*> tokens) {
  tokens_ = std::move(tokens);
  nodes_.assign(1, Node{});
  root_children_.fill(-1);
  for (std::size_t t = 0; t < tokens_.size(); ++t) {
    std::int32_t node = 0;
    for (const char ch : tokens_[t]->content) {
      const auto byte = static_cast<unsigned char>(ch);
      std::int32_t child = Child(node, byte);
      if (child < 0) {
        child = static_cast<std::int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        auto& children = nodes_[node].children;
        children.insert(std::lower_bound(children.begin(), children.end(),
                                         std::make_pair(byte, std::int32_t{-1})),
                        {byte, child});
        if (node == 0) root_children_[byte] = child;
      }
      node = child;
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<std::int32_t>(t);
  }
}

std::int32_t AddedTokenMatcher::Child(std::int32_t node, unsigned char byte) const {
  if (node == 0) return nodes_.size() > 1 ? root_children_[byte] : -1;
  const auto& children = nodes_[node].children;
  const auto it = std::lower_bound(children.begin(), children.end(),
                                   std::make_pair(byte, std::int32_t{-1}));
  return it != children.end() && it->first == byte ? it->second : -1;
}

void AddedTokenMatcher::Split(std::string_view text, std::size_t begin, std::size_t end,
                              std::vector<Segment>* out) const {
  if (tokens_.empty() || begin == end) {
    if (begin != end) out->push_back({begin, end, nullptr});
    return;
  }
  struct Match {
    std::size_t begin, end;
    const AddedToken* token;
  };
  std::vector<Match> matches;
  for (std::size_t p = begin; p < end;) {
    std::int32_t node = 0;
    std::size_t best_end = 0;
    std::int32_t best_token = -1;
    for (std::size_t q = p; q < end; ++q) {
      node = Child(node, static_cast<unsigned char>(text[q]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        best_token = nodes_[node].token;
        best_end = q + 1;
      }
    }
    if (best_token >= 0) {
      matches.push_back({p, best_end, tokens_[best_token]});
      p = best_end;
    } else {
      ++p;
    }
  }
  const CharTable& table = CharTable::Get();
  auto char_before = [&](std::size_t at) {
    char32_t cp;
    DecodeUtf8(text.data(), PreviousCharStart(text.data(), at), &cp);
    return cp;
  };
  std::size_t emitted = begin;
  for (const Match& match : matches) {
    std::size_t start = match.begin;
    std::size_t stop = match.end;
    const AddedToken& token = *match.token;
    if (token.single_word) {
      // Must not touch a word char (regex \w) on either side, within this segment.
      const bool word_before = start > begin && table.IsWord(char_before(start));
      char32_t next_cp = 0;
      const bool word_after =
          stop < end && (DecodeUtf8(text.data(), stop, &next_cp), table.IsWord(next_cp));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      std::size_t new_start = start;
      while (new_start > begin && table.IsStripSpace(char_before(new_start))) {
        new_start = PreviousCharStart(text.data(), new_start);
      }
      start = std::max(new_start, emitted);
    }
    if (token.rstrip) {
      while (stop < end) {
        char32_t cp;
        const std::size_t length = DecodeUtf8(text.data(), stop, &cp);
        if (!table.IsStripSpace(cp)) break;
        stop += length;
      }
    }
    if (emitted < start) out->push_back({emitted, start, nullptr});
    out->push_back({start, stop, &token});
    emitted = stop;
  }
  if (emitted < end) out->push_back({emitted, end, nullptr});
}

}  // namespace tritonforge_tokenizer
