// Encode / decode / incremental decode over a loaded TokenizerModel.
#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "model.h"

namespace tritonforge_tokenizer {
namespace {

void CheckUtf8(std::string_view text) {
  const std::size_t bad = FindInvalidUtf8(text);
  if (bad != std::string_view::npos) {
    throw InputError("text is not valid UTF-8 (invalid byte 0x" +
                     [&] {
                       static const char* hex = "0123456789ABCDEF";
                       const auto byte = static_cast<unsigned char>(text[bad]);
                       return std::string{hex[byte >> 4], hex[byte & 15]};
                     }() +
                     " at byte offset " + std::to_string(bad) + ")");
  }
}

}  // namespace

void TokenizerModel::EncodeInto(std::string_view text, bool add_special_tokens,
                                std::vector<TokenId>* ids) const {
  CheckUtf8(text);
  thread_local std::vector<Segment> outer, inner;
  thread_local PreTokenizerScratch scratch;
  if (add_special_tokens) ids->insert(ids->end(), prefix_ids.begin(), prefix_ids.end());
  outer.clear();
  raw_matcher.Split(text, 0, text.size(), &outer);
  for (const Segment& segment : outer) {
    if (segment.token != nullptr) {
      ids->push_back(segment.token->id);
      continue;
    }
    inner.clear();
    normalized_matcher.Split(text, segment.begin, segment.end, &inner);
    for (const Segment& piece : inner) {
      if (piece.token != nullptr) {
        ids->push_back(piece.token->id);
        continue;
      }
      PreTokenize(pre_tokenizer, text.substr(piece.begin, piece.end - piece.begin), &scratch);
      for (std::string_view word : scratch.pieces) bpe.Tokenize(word, ids);
    }
  }
  if (add_special_tokens) ids->insert(ids->end(), suffix_ids.begin(), suffix_ids.end());
}

void TokenizerModel::AppendIdBytes(TokenId id, bool skip_special_tokens, std::string* out) const {
  if (id >= id_flags.size()) {
    throw InputError("token id " + std::to_string(id) + " is out of range (vocabulary size " +
                     std::to_string(id_flags.size()) + ")");
  }
  const std::uint8_t flags = id_flags[id];
  if (!(flags & kIdExists)) throw InputError("token id " + std::to_string(id) + " has no token");
  if (skip_special_tokens && (flags & kIdSpecial)) return;
  out->append(id_bytes[id]);
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  model_->EncodeInto(text, add_special_tokens, &ids);
  return ids;
}

std::vector<std::vector<TokenId>> Tokenizer::EncodeBatch(const std::vector<std::string>& texts,
                                                         bool add_special_tokens,
                                                         unsigned threads) const {
  std::vector<std::vector<TokenId>> result(texts.size());
  std::size_t total_bytes = 0;
  for (const std::string& text : texts) total_bytes += text.size();
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  // Below ~64 KiB the thread start-up costs more than it saves.
  if (texts.size() < 2 || total_bytes < (64u << 10)) threads = 1;
  threads = std::min<unsigned>(threads, static_cast<unsigned>(texts.size()));

  std::atomic<std::size_t> next{0};
  std::mutex error_mutex;
  std::size_t error_index = texts.size();
  std::string error_message;
  auto work = [&] {
    for (std::size_t i = next++; i < texts.size(); i = next++) {
      try {
        result[i].reserve(texts[i].size() / 3 + 4);
        model_->EncodeInto(texts[i], add_special_tokens, &result[i]);
      } catch (const InputError& e) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (i < error_index) {
          error_index = i;
          error_message = e.what();
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
  if (error_index < texts.size()) {
    throw InputError("text " + std::to_string(error_index) + ": " + error_message);
  }
  return result;
}

std::string Tokenizer::Decode(const TokenId* ids, std::size_t count,
                              bool skip_special_tokens) const {
  std::string bytes;
  for (std::size_t i = 0; i < count; ++i) model_->AppendIdBytes(ids[i], skip_special_tokens, &bytes);
  std::string text;
  text.reserve(bytes.size());
  std::size_t consumed = 0;
  AppendLossyUtf8(bytes, /*keep_incomplete=*/false, &text, &consumed);
  return text;
}

std::size_t Tokenizer::VocabSize() const { return model_->id_flags.size(); }

bool Tokenizer::HasId(TokenId id) const {
  return id < model_->id_flags.size() && (model_->id_flags[id] & TokenizerModel::kIdExists);
}

std::optional<TokenId> Tokenizer::TokenToId(std::string_view token) const {
  const auto it = model_->token_to_id.find(std::string(token));
  if (it == model_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::IdToToken(TokenId id) const {
  if (!HasId(id)) return std::nullopt;
  return model_->id_token[id];
}

bool Tokenizer::IsSpecial(TokenId id) const {
  return HasId(id) && (model_->id_flags[id] & TokenizerModel::kIdSpecial);
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : model_(tokenizer.model()), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDecoder::Add(TokenId id) { return Add(&id, 1); }

std::string IncrementalDecoder::Add(const TokenId* ids, std::size_t count) {
  const std::size_t before = pending_.size();
  try {
    for (std::size_t i = 0; i < count; ++i) {
      model_->AppendIdBytes(ids[i], skip_special_tokens_, &pending_);
    }
  } catch (...) {
    pending_.resize(before);
    throw;
  }
  std::string text;
  std::size_t consumed = 0;
  AppendLossyUtf8(pending_, /*keep_incomplete=*/true, &text, &consumed);
  pending_.erase(0, consumed);
  return text;
}

std::string IncrementalDecoder::Finish() {
  std::string text;
  std::size_t consumed = 0;
  AppendLossyUtf8(pending_, /*keep_incomplete=*/false, &text, &consumed);
  pending_.clear();
  return text;
}

}  // namespace tritonforge_tokenizer
