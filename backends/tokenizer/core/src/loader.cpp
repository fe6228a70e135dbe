// tokenizer.json -> TokenizerModel. Everything a byte-level BPE tokenizer can carry is
// either implemented exactly or refused with a LoadError that names the component: a
// silently ignored option would mean silently different token ids.
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "model.h"

namespace tritonforge_tokenizer {
namespace {

using nlohmann::json;

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class Loader {
 public:
  explicit Loader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void Fail(const std::string& what) const {
    throw LoadError("tokenizer " + origin_ + ": " + what);
  }

  std::shared_ptr<TokenizerModel> Load(std::string_view text) {
    json root;
    try {
      root = json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
      Fail(std::string("not valid JSON (") + e.what() + ")");
    }
    if (!root.is_object()) Fail("the top level is not a JSON object");
    model_ = std::make_shared<TokenizerModel>();
    model_->origin = origin_;
    try {
      RefuseNonNull(root, "truncation",
                    "truncation is not supported; set it to null (limit lengths in the caller)");
      RefuseNonNull(root, "padding", "padding is not supported; set it to null");
      LoadNormalizer(Member(root, "normalizer"));
      LoadBpe(Member(root, "model"));
      LoadPreTokenizer(Member(root, "pre_tokenizer"), "pre_tokenizer");
      FinishPreTokenizer();
      LoadAddedTokens(Member(root, "added_tokens"));
      LoadPostProcessor(Member(root, "post_processor"), "post_processor");
      LoadDecoder(Member(root, "decoder"), "decoder");
    } catch (const json::exception& e) {
      Fail(std::string("unexpected JSON structure (") + e.what() + ")");
    }
    BuildIdTables();
    return model_;
  }

 private:
  static const json& Member(const json& object, const char* key) {
    static const json null_value;
    const auto it = object.find(key);
    return it == object.end() ? null_value : *it;
  }

  static std::string TypeOf(const json& component) {
    const json& type = Member(component, "type");
    return type.is_string() ? type.get<std::string>() : "<missing type>";
  }

  static bool Flag(const json& object, const char* key, bool fallback) {
    const json& value = Member(object, key);
    return value.is_boolean() ? value.get<bool>() : fallback;
  }

  void RefuseNonNull(const json& root, const char* key, const std::string& message) const {
    if (!Member(root, key).is_null()) Fail(message);
  }

  void LoadNormalizer(const json& normalizer) const {
    if (normalizer.is_null()) return;
    const std::string type = TypeOf(normalizer);
    if (type == "Sequence" && Member(normalizer, "normalizers").empty()) return;
    Fail("normalizer '" + type +
         "' is not supported (only byte-level BPE without a normalizer is)");
  }

  void LoadBpe(const json& model) {
    if (!model.is_object()) Fail("'model' is missing");
    const std::string type = model.contains("type") ? TypeOf(model) : "BPE";
    if (type != "BPE") Fail("model type '" + type + "' is not supported (only BPE is)");
    const json& dropout = Member(model, "dropout");
    if (!dropout.is_null() && dropout.get<double>() != 0.0) {
      Fail("BPE dropout is not supported (it makes encoding random)");
    }
    if (Flag(model, "byte_fallback", false)) {
      Fail("BPE byte_fallback is not supported (it belongs to SentencePiece-style BPE, "
           "not byte-level BPE)");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json& value = Member(model, key);
      if (!value.is_null() && !value.get<std::string>().empty()) {
        Fail(std::string("BPE ") + key + " is not supported");
      }
    }
    BpeModel& bpe = model_->bpe;
    bpe.ignore_merges = Flag(model, "ignore_merges", false);
    bpe.fuse_unk = Flag(model, "fuse_unk", false);
    const json& vocab = Member(model, "vocab");
    if (!vocab.is_object()) Fail("'model.vocab' is missing or not an object");
    bpe.vocab.reserve(vocab.size());
    for (const auto& [token, id] : vocab.items()) {
      if (!id.is_number_unsigned() || id.get<std::uint64_t>() > 0x7FFFFFFF) {
        Fail("vocabulary entry '" + token + "' has an invalid id");
      }
      bpe.vocab.emplace(token, id.get<TokenId>());
    }
    const json& unk = Member(model, "unk_token");
    if (unk.is_string()) {
      const auto it = bpe.vocab.find(unk.get<std::string>());
      if (it == bpe.vocab.end()) Fail("unk_token '" + unk.get<std::string>() + "' is not in the vocabulary");
      bpe.has_unk = true;
      bpe.unk_id = it->second;
    }
    LoadMerges(Member(model, "merges"));
    for (int byte = 0; byte < 256; ++byte) {
      const auto it = bpe.vocab.find(Utf8Of(ByteToUnicode(static_cast<unsigned char>(byte))));
      bpe.byte_ids[byte] = it == bpe.vocab.end() ? -1 : std::int64_t{it->second};
    }
    if (bpe.ignore_merges) {
      for (const auto& [token, id] : bpe.vocab) {
        std::string raw;
        if (ByteLevelToRaw(token, &raw)) bpe.raw_vocab.emplace(std::move(raw), id);
      }
    }
  }

  void LoadMerges(const json& merges) {
    if (!merges.is_array()) Fail("'model.merges' is missing or not an array");
    BpeModel& bpe = model_->bpe;
    bpe.merges.reserve(merges.size());
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
      const json& merge = merges[rank];
      std::string left, right;
      if (merge.is_string()) {  // legacy form "left right"
        const std::string line = merge.get<std::string>();
        const std::size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
          Fail("merge #" + std::to_string(rank) + " '" + line + "' is not two tokens");
        }
        left = line.substr(0, space);
        right = line.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2) {  // current form ["left", "right"]
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        Fail("merge #" + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      const TokenId left_id = VocabId(left, rank);
      const TokenId right_id = VocabId(right, rank);
      const TokenId merged_id = VocabId(left + right, rank);
      // A repeated pair keeps its last rank, as a map built in file order does.
      bpe.merges[(std::uint64_t(left_id) << 32) | right_id] =
          (std::uint64_t(rank) << 32) | merged_id;
    }
  }

  TokenId VocabId(const std::string& token, std::size_t rank) const {
    const auto it = model_->bpe.vocab.find(token);
    if (it == model_->bpe.vocab.end()) {
      Fail("merge #" + std::to_string(rank) + ": token '" + token + "' is not in the vocabulary");
    }
    return it->second;
  }

  void LoadPreTokenizer(const json& pre, const std::string& where) {
    if (pre.is_null()) Fail("a ByteLevel pre_tokenizer is required (byte-level BPE)");
    const std::string type = TypeOf(pre);
    if (type == "Sequence") {
      for (const json& step : Member(pre, "pretokenizers")) {
        LoadPreTokenizer(step, where + ".Sequence");
      }
      return;
    }
    PreTokenizerStep step{};
    if (type == "ByteLevel") {
      step.kind = PreTokenizerStep::Kind::kByteLevel;
      step.add_prefix_space = Flag(pre, "add_prefix_space", true);
      step.use_regex = Flag(pre, "use_regex", true);
    } else if (type == "Split") {
      step.kind = PreTokenizerStep::Kind::kSplit;
      const json& pattern = Member(pre, "pattern");
      if (!Member(pattern, "Regex").is_string()) {
        Fail(where + ": Split with a String pattern is not supported (only the GPT-2 and "
                     "Llama-3 regexes are)");
      }
      const std::string regex = Member(pattern, "Regex").get<std::string>();
      if (regex == kGpt2Pattern) {
        step.pattern = SplitPattern::kGpt2;
      } else if (regex == kCl100kPattern) {
        step.pattern = SplitPattern::kCl100k;
      } else {
        Fail(where + ": Split regex " + json(regex).dump() +
             " is not supported (only the GPT-2 and Llama-3 patterns are)");
      }
      const json& behavior = Member(pre, "behavior");
      if (!behavior.is_string() || behavior.get<std::string>() != "Isolated") {
        Fail(where + ": Split behavior " + behavior.dump() + " is not supported (only Isolated)");
      }
      if (Flag(pre, "invert", false)) Fail(where + ": Split with invert=true is not supported");
    } else {
      Fail(where + ": pre-tokenizer '" + type +
           "' is not supported (supported: ByteLevel, Split with the GPT-2 or Llama-3 "
           "pattern, Sequence of those)");
    }
    model_->pre_tokenizer.push_back(step);
  }

  void FinishPreTokenizer() const {
    const auto& steps = model_->pre_tokenizer;
    std::size_t byte_level = 0;
    for (const auto& step : steps) byte_level += step.kind == PreTokenizerStep::Kind::kByteLevel;
    if (byte_level != 1 || steps.back().kind != PreTokenizerStep::Kind::kByteLevel) {
      Fail("the pre_tokenizer must end with exactly one ByteLevel step (byte-level BPE)");
    }
  }

  void LoadAddedTokens(const json& tokens) {
    if (tokens.is_null()) return;
    std::set<std::string> seen;
    for (const json& entry : tokens) {
      AddedToken token;
      token.content = Member(entry, "content").get<std::string>();
      if (token.content.empty() || !seen.insert(token.content).second) continue;
      if (FindInvalidUtf8(token.content) != std::string_view::npos) {
        Fail("added token " + std::to_string(entry.value("id", 0)) + " is not valid UTF-8");
      }
      // An added token already in the vocabulary keeps the vocabulary's id (as in HF).
      const auto in_vocab = model_->bpe.vocab.find(token.content);
      token.id = in_vocab != model_->bpe.vocab.end() ? in_vocab->second
                                                     : Member(entry, "id").get<TokenId>();
      token.special = Flag(entry, "special", false);
      token.single_word = Flag(entry, "single_word", false);
      token.lstrip = Flag(entry, "lstrip", false);
      token.rstrip = Flag(entry, "rstrip", false);
      token.normalized = Flag(entry, "normalized", !token.special);
      model_->added_tokens.push_back(std::move(token));
    }
    std::vector<const AddedToken*> raw, normalized;
    for (bool special : {true, false}) {  // HF's order: special tokens, then the others
      for (const AddedToken& token : model_->added_tokens) {
        if (token.special != special) continue;
        (token.normalized ? normalized : raw).push_back(&token);
      }
    }
    model_->raw_matcher.Build(std::move(raw));
    model_->normalized_matcher.Build(std::move(normalized));
  }

  std::vector<TokenId> SpecialIds(const json& pair, const std::string& where) const {
    // Roberta/Bert processors store [token, id].
    if (!pair.is_array() || pair.size() != 2) Fail(where + " is not [token, id]");
    return {pair[1].get<TokenId>()};
  }

  void LoadPostProcessor(const json& post, const std::string& where) {
    if (post.is_null()) return;
    const std::string type = TypeOf(post);
    std::vector<TokenId> prefix, suffix;
    if (type == "ByteLevel") {
      return;  // offsets only
    } else if (type == "Sequence") {
      for (const json& processor : Member(post, "processors")) {
        LoadPostProcessor(processor, where + ".Sequence");
      }
      return;
    } else if (type == "TemplateProcessing") {
      bool seen_sequence = false;
      for (const json& piece : Member(post, "single")) {
        if (piece.contains("Sequence")) {
          if (Member(piece["Sequence"], "id") != "A") {
            Fail(where + ": the single-sequence template refers to sequence B");
          }
          seen_sequence = true;
        } else if (piece.contains("SpecialToken")) {
          const std::string name = Member(piece["SpecialToken"], "id").get<std::string>();
          const json& special = Member(Member(post, "special_tokens"), name.c_str());
          if (!special.is_object()) Fail(where + ": template token '" + name + "' is not defined");
          for (const json& id : Member(special, "ids")) {
            (seen_sequence ? suffix : prefix).push_back(id.get<TokenId>());
          }
        } else {
          Fail(where + ": unknown template piece " + piece.dump());
        }
      }
      if (!seen_sequence) Fail(where + ": the single-sequence template has no $A");
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      prefix = SpecialIds(Member(post, "cls"), where + ".cls");
      suffix = SpecialIds(Member(post, "sep"), where + ".sep");
    } else {
      Fail(where + ": post-processor '" + type + "' is not supported (supported: ByteLevel, "
           "TemplateProcessing, RobertaProcessing, BertProcessing, Sequence of those)");
    }
    // A processor wraps what the previous ones produced.
    prefix.insert(prefix.end(), model_->prefix_ids.begin(), model_->prefix_ids.end());
    model_->prefix_ids = std::move(prefix);
    model_->suffix_ids.insert(model_->suffix_ids.end(), suffix.begin(), suffix.end());
  }

  void LoadDecoder(const json& decoder, const std::string& where) const {
    const std::string type = decoder.is_null() ? "null" : TypeOf(decoder);
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
      const json& decoders = Member(decoder, "decoders");
      if (decoders.size() == 1) return LoadDecoder(decoders[0], where + ".Sequence");
    }
    Fail(where + ": decoder '" + type + "' is not supported (only ByteLevel is)");
  }

  void BuildIdTables() {
    TokenizerModel& m = *model_;
    std::size_t size = 0;
    for (const auto& [token, id] : m.bpe.vocab) size = std::max<std::size_t>(size, id + 1);
    for (const AddedToken& token : m.added_tokens) size = std::max<std::size_t>(size, token.id + 1);
    m.id_token.assign(size, {});
    m.id_bytes.assign(size, {});
    m.id_flags.assign(size, 0);
    for (const auto& [token, id] : m.bpe.vocab) {
      m.id_token[id] = token;
      m.id_flags[id] = TokenizerModel::kIdExists;
    }
    std::set<std::string> special;
    for (const AddedToken& token : m.added_tokens) {
      m.id_token[token.id] = token.content;  // added tokens take precedence, as in HF
      m.id_flags[token.id] = TokenizerModel::kIdExists;
      if (token.special) special.insert(token.content);
      m.token_to_id.emplace(token.content, token.id);
    }
    for (const auto& [token, id] : m.bpe.vocab) m.token_to_id.emplace(token, id);
    for (std::size_t id = 0; id < size; ++id) {
      if (!m.id_flags[id]) continue;
      // ByteLevel decoder: map each char back to its byte; a token with a char outside
      // the 256-symbol alphabet is taken as its UTF-8 text.
      if (!ByteLevelToRaw(m.id_token[id], &m.id_bytes[id])) m.id_bytes[id] = m.id_token[id];
      if (special.count(m.id_token[id])) m.id_flags[id] |= TokenizerModel::kIdSpecial;
    }
  }

  static std::string Utf8Of(char32_t cp) {
    std::string out;
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return out;
  }

  static bool ByteLevelToRaw(const std::string& token, std::string* raw) {
    raw->clear();
    if (FindInvalidUtf8(token) != std::string_view::npos) return false;
    std::size_t i = 0;
    while (i < token.size()) {
      char32_t cp;
      i += DecodeUtf8(token.data(), i, &cp);
      const int byte = UnicodeToByte(cp);
      if (byte < 0) return false;
      *raw += static_cast<char>(byte);
    }
    return true;
  }

  std::string origin_;
  std::shared_ptr<TokenizerModel> model_;
};

}  // namespace

char32_t ByteToUnicode(unsigned char byte) {
  // Printable Latin-1 bytes map to themselves; the other 68 to U+0100.. in byte order.
  if ((byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE) {
    return byte;
  }
  char32_t shifted = 0;
  for (unsigned b = 0; b < byte; ++b) {
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) ++shifted;
  }
  return 0x100 + shifted;
}

int UnicodeToByte(char32_t cp) {
  static const std::vector<int> table = [] {
    std::vector<int> t(0x144, -1);
    for (int b = 0; b < 256; ++b) t[ByteToUnicode(static_cast<unsigned char>(b))] = b;
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

std::shared_ptr<TokenizerModel> LoadTokenizerModel(std::string_view json_text,
                                                   const std::string& origin) {
  return Loader(origin).Load(json_text);
}

Tokenizer Tokenizer::FromFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw LoadError("tokenizer file '" + path + "' cannot be opened");
  std::ostringstream content;
  content << file.rdbuf();
  if (file.bad()) throw LoadError("tokenizer file '" + path + "' cannot be read");
  return Tokenizer(LoadTokenizerModel(content.str(), "file '" + path + "'"));
}

Tokenizer Tokenizer::FromJson(std::string_view json_text, const std::string& origin) {
  return Tokenizer(LoadTokenizerModel(json_text, origin));
}

}  // namespace tritonforge_tokenizer
