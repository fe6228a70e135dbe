// Byte-level BPE, merging in exactly the order `tokenizers` does: always the lowest-rank
// pair, leftmost first among equal ranks, re-queueing the pairs a merge creates. (Merging
// "all occurrences of the best pair" per round, as GPT-2's reference code does, can give
// different ids when several pairs produce the same token.)
#include <algorithm>
#include <vector>

#include "model.h"

namespace tritonforge_tokenizer {
namespace {

struct Symbol {
  TokenId id;
  std::int32_t prev;
  std::int32_t next;
  bool alive;
};

struct QueuedMerge {
  std::uint32_t rank;
  std::uint32_t pos;
  TokenId new_id;
};

// Min-heap order: lower rank first, then lower position.
bool Later(const QueuedMerge& a, const QueuedMerge& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

inline std::uint64_t PairKey(TokenId left, TokenId right) {
  return (std::uint64_t(left) << 32) | right;
}

}  // namespace

void BpeModel::Tokenize(std::string_view piece, std::vector<TokenId>* out) const {
  if (ignore_merges) {
    const auto whole = raw_vocab.find(std::string(piece));
    if (whole != raw_vocab.end()) {
      out->push_back(whole->second);
      return;
    }
  }
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<QueuedMerge> queue;
  symbols.clear();
  queue.clear();
  bool last_was_unk = false;
  for (const char ch : piece) {
    const std::int64_t id = byte_ids[static_cast<unsigned char>(ch)];
    if (id >= 0) {
      symbols.push_back({static_cast<TokenId>(id), 0, 0, true});
      last_was_unk = false;
    } else if (has_unk) {
      // A byte whose symbol is missing from the vocabulary: the unknown token, one per
      // byte or one per run with fuse_unk. Without an unknown token it is dropped.
      if (!(fuse_unk && last_was_unk)) symbols.push_back({unk_id, 0, 0, true});
      last_was_unk = true;
    }
  }
  const auto count = static_cast<std::int32_t>(symbols.size());
  for (std::int32_t i = 0; i < count; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < count ? i + 1 : -1;
  }
  auto push_pair = [&](std::int32_t left) {
    const std::int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto found = merges.find(PairKey(symbols[left].id, symbols[right].id));
    if (found == merges.end()) return;
    queue.push_back({static_cast<std::uint32_t>(found->second >> 32),
                     static_cast<std::uint32_t>(left), static_cast<TokenId>(found->second)});
    std::push_heap(queue.begin(), queue.end(), Later);
  };
  for (std::int32_t i = 0; i + 1 < count; ++i) push_pair(i);
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), Later);
    const QueuedMerge top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Stale entry: the pair at this position changed since it was queued.
    const auto current = merges.find(PairKey(left.id, right.id));
    if (current == merges.end() || static_cast<TokenId>(current->second) != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = static_cast<std::int32_t>(top.pos);
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(static_cast<std::int32_t>(top.pos));
  }
  for (std::int32_t i = count > 0 ? 0 : -1; i >= 0; i = symbols[i].next) {
    out->push_back(symbols[i].id);
  }
}

}  // namespace tritonforge_tokenizer
