// Triton C++ backend `tokenizer`: serves the tokenizer core as two kinds of model.
//
//   encode model (e.g. `preprocessing`): text_input BYTES [1] -> input_ids INT32 [-1],
//                                        input_lengths INT32 [1]
//   decode model (e.g. `postprocessing`): output_ids INT32 [-1] -> text_output BYTES [1]
//
// The kind follows from the tensors the config declares. Model parameters:
// `tokenizer_file` (required; $VAR / ${VAR} expanded, relative to the model directory),
// `add_special_tokens` / `pad_id` (encode), `skip_special_tokens` (decode); the booleans
// can be overridden per request with request parameters of the same name.
//
// Ownership rules, enforced by the small RAII types below: every request is released
// exactly once, every response is sent or deleted, every error object we own is freed.
// A bad request gets an error response naming the problem; the model stays READY.
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "triton_api.h"
#include "tritonforge_tokenizer/tokenizer.h"

namespace {

namespace api = triton_api;
using nlohmann::json;
using tritonforge_tokenizer::TokenId;

#define TRITONFORGE_EXPORT extern "C" __attribute__((visibility("default")))

// An error with the Triton code it should be reported with.
class BackendError : public std::runtime_error {
 public:
  BackendError(std::int32_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  std::int32_t code() const { return code_; }

 private:
  std::int32_t code_;
};

struct ErrorDeleter {
  void operator()(TRITONSERVER_Error* error) const { TRITONSERVER_ErrorDelete(error); }
};
using OwnedError = std::unique_ptr<TRITONSERVER_Error, ErrorDeleter>;

void Log(std::int32_t level, int line, const std::string& message) {
  OwnedError(TRITONSERVER_LogMessage(level, __FILE__, line, message.c_str()));
}

// Takes ownership of a returned error and turns it into an exception.
void Check(TRITONSERVER_Error* error, const char* what) {
  if (error == nullptr) return;
  const OwnedError owned(error);
  throw BackendError(api::kErrorInternal,
                     std::string(what) + ": " + TRITONSERVER_ErrorMessage(error));
}

// Logs (and frees) an error from a call whose failure we cannot act on.
void LogIfError(TRITONSERVER_Error* error, const char* what) {
  if (error == nullptr) return;
  const OwnedError owned(error);
  Log(api::kLogError, __LINE__, std::string(what) + ": " + TRITONSERVER_ErrorMessage(error));
}

TRITONSERVER_Error* ToTritonError(std::int32_t code, const std::string& message) {
  return TRITONSERVER_ErrorNew(code, message.c_str());
}

std::uint64_t NowNs() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

// ---- Configuration -------------------------------------------------------------------

enum class Role { kEncode, kDecode };

struct TensorSpec {
  const char* name;
  const char* data_type;
  std::int64_t dim;  // the single dimension the config must declare
};

constexpr TensorSpec kTextInput{"text_input", "TYPE_STRING", 1};
constexpr TensorSpec kInputIds{"input_ids", "TYPE_INT32", -1};
constexpr TensorSpec kInputLengths{"input_lengths", "TYPE_INT32", 1};
constexpr TensorSpec kOutputIds{"output_ids", "TYPE_INT32", -1};
constexpr TensorSpec kTextOutput{"text_output", "TYPE_STRING", 1};

std::string ExpandEnvironment(const std::string& value) {
  std::string out;
  for (std::size_t i = 0; i < value.size();) {
    if (value[i] != '$') {
      out += value[i++];
      continue;
    }
    std::size_t name_begin = i + 1;
    std::size_t name_end;
    std::size_t next;
    if (name_begin < value.size() && value[name_begin] == '{') {
      ++name_begin;
      name_end = value.find('}', name_begin);
      if (name_end == std::string::npos) {
        throw BackendError(api::kErrorInvalidArg, "unterminated ${ in '" + value + "'");
      }
      next = name_end + 1;
    } else {
      name_end = name_begin;
      while (name_end < value.size() &&
             (std::isalnum(static_cast<unsigned char>(value[name_end])) || value[name_end] == '_')) {
        ++name_end;
      }
      next = name_end;
    }
    const std::string name = value.substr(name_begin, name_end - name_begin);
    if (name.empty()) {
      out += value[i++];
      continue;
    }
    const char* env = std::getenv(name.c_str());
    if (env == nullptr) {
      throw BackendError(api::kErrorInvalidArg, "environment variable " + name + " (used in '" +
                                                    value + "') is not set");
    }
    out += env;
    i = next;
  }
  return out;
}

bool ParseBool(const std::string& name, std::string value) {
  for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (value == "true" || value == "1" || value == "yes") return true;
  if (value == "false" || value == "0" || value == "no") return false;
  throw BackendError(api::kErrorInvalidArg,
                     "parameter '" + name + "' must be true or false, got '" + value + "'");
}

class ModelState {
 public:
  explicit ModelState(TRITONBACKEND_Model* model) {
    const char* name = nullptr;
    Check(TRITONBACKEND_ModelName(model, &name), "reading the model name");
    name_ = name;
    std::int32_t artifact_type = 0;
    const char* location = nullptr;
    Check(TRITONBACKEND_ModelRepository(model, &artifact_type, &location),
          "reading the model directory");
    directory_ = location != nullptr ? location : ".";

    TRITONSERVER_Message* message = nullptr;
    Check(TRITONBACKEND_ModelConfig(model, 1, &message), "reading the model config");
    const char* base = nullptr;
    std::size_t size = 0;
    TRITONSERVER_Error* error = TRITONSERVER_MessageSerializeToJson(message, &base, &size);
    const std::string text = error == nullptr ? std::string(base, size) : std::string();
    LogIfError(TRITONSERVER_MessageDelete(message), "freeing the model config");
    Check(error, "serializing the model config");
    Configure(json::parse(text));
  }

  const std::string& name() const { return name_; }
  Role role() const { return role_; }
  bool batching() const { return max_batch_size_ > 0; }
  const tritonforge_tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  bool add_special_tokens() const { return add_special_tokens_; }
  bool skip_special_tokens() const { return skip_special_tokens_; }
  std::int32_t pad_id() const { return pad_id_; }

 private:
  void Configure(const json& config) {
    max_batch_size_ = config.value("max_batch_size", 0);
    const json empty = json::array();
    const json& inputs = config.contains("input") ? config["input"] : empty;
    const json& outputs = config.contains("output") ? config["output"] : empty;
    auto declares = [](const json& tensors, const TensorSpec& spec) {
      for (const json& tensor : tensors) {
        if (tensor.value("name", "") == spec.name) return true;
      }
      return false;
    };
    if (declares(inputs, kTextInput)) {
      role_ = Role::kEncode;
      Expect(inputs, {kTextInput}, "input");
      Expect(outputs, {kInputIds, kInputLengths}, "output");
    } else if (declares(inputs, kOutputIds)) {
      role_ = Role::kDecode;
      Expect(inputs, {kOutputIds}, "input");
      Expect(outputs, {kTextOutput}, "output");
    } else {
      throw BackendError(api::kErrorInvalidArg,
                         "model '" + name_ +
                             "': the tokenizer backend needs input 'text_input' (an encode "
                             "model) or input 'output_ids' (a decode model)");
    }

    const json& parameters = config.contains("parameters") ? config["parameters"] : json::object();
    auto parameter = [&](const char* key) -> std::optional<std::string> {
      const auto it = parameters.find(key);
      if (it == parameters.end() || !it->contains("string_value")) return std::nullopt;
      return (*it)["string_value"].get<std::string>();
    };
    const std::optional<std::string> file = parameter("tokenizer_file");
    if (!file || file->empty()) {
      throw BackendError(api::kErrorInvalidArg,
                         "model '" + name_ + "': parameter 'tokenizer_file' is required");
    }
    std::string path = ExpandEnvironment(*file);
    if (!path.empty() && path.front() != '/') path = directory_ + "/" + path;
    if (const std::optional<std::string> v = parameter("add_special_tokens")) {
      add_special_tokens_ = ParseBool("add_special_tokens", *v);
    }
    if (const std::optional<std::string> v = parameter("skip_special_tokens")) {
      skip_special_tokens_ = ParseBool("skip_special_tokens", *v);
    }
    if (const std::optional<std::string> v = parameter("pad_id")) {
      try {
        pad_id_ = std::stoi(*v);
      } catch (const std::exception&) {
        throw BackendError(api::kErrorInvalidArg, "parameter 'pad_id' is not an integer: " + *v);
      }
    }
    try {
      tokenizer_ = std::make_unique<tritonforge_tokenizer::Tokenizer>(
          tritonforge_tokenizer::Tokenizer::FromFile(path));
    } catch (const tritonforge_tokenizer::LoadError& e) {
      throw BackendError(api::kErrorInvalidArg, "model '" + name_ + "': " + e.what());
    }
    Log(api::kLogInfo, __LINE__,
        "tokenizer model '" + name_ + "' (" + (role_ == Role::kEncode ? "encode" : "decode") +
            "): loaded " + path + ", vocabulary size " +
            std::to_string(tokenizer_->VocabSize()));
  }

  void Expect(const json& tensors, std::initializer_list<TensorSpec> specs,
              const char* kind) const {
    if (tensors.size() != specs.size()) {
      std::string names;
      for (const TensorSpec& spec : specs) names += std::string(names.empty() ? "" : ", ") + spec.name;
      throw BackendError(api::kErrorInvalidArg, "model '" + name_ + "' must declare exactly the " +
                                                    kind + " tensors: " + names);
    }
    for (const TensorSpec& spec : specs) {
      const json* found = nullptr;
      for (const json& tensor : tensors) {
        if (tensor.value("name", "") == spec.name) found = &tensor;
      }
      const std::string expected = std::string(spec.name) + " (" + spec.data_type + ", dims [" +
                                   std::to_string(spec.dim) + "])";
      const json dims = found != nullptr ? found->value("dims", json::array()) : json::array();
      if (found == nullptr || found->value("data_type", "") != spec.data_type ||
          dims.size() != 1 || dims[0].get<std::int64_t>() != spec.dim) {
        throw BackendError(api::kErrorInvalidArg, "model '" + name_ + "': expected " + kind +
                                                      " tensor " + expected);
      }
    }
  }

  std::string name_;
  std::string directory_;
  Role role_ = Role::kEncode;
  int max_batch_size_ = 0;
  bool add_special_tokens_ = true;
  bool skip_special_tokens_ = true;
  std::int32_t pad_id_ = 0;
  std::unique_ptr<tritonforge_tokenizer::Tokenizer> tokenizer_;
};

// ---- Request / response ownership ----------------------------------------------------

// Owns one request until it is released (exactly once, in the destructor).
class RequestHandle {
 public:
  explicit RequestHandle(TRITONBACKEND_Request* request) : request_(request) {}
  RequestHandle(const RequestHandle&) = delete;
  RequestHandle& operator=(const RequestHandle&) = delete;
  ~RequestHandle() {
    LogIfError(TRITONBACKEND_RequestRelease(request_, api::kRequestReleaseAll),
               "releasing a request");
  }
  TRITONBACKEND_Request* get() const { return request_; }

 private:
  TRITONBACKEND_Request* request_;
};

// A response that is either sent (once) or deleted when it goes out of scope.
class ResponseHandle {
 public:
  explicit ResponseHandle(TRITONBACKEND_Request* request) {
    LogIfError(TRITONBACKEND_ResponseNew(&response_, request), "creating a response");
  }
  ResponseHandle(const ResponseHandle&) = delete;
  ResponseHandle& operator=(const ResponseHandle&) = delete;
  ~ResponseHandle() {
    if (response_ != nullptr) {
      LogIfError(TRITONBACKEND_ResponseDelete(response_), "deleting an unsent response");
    }
  }
  bool valid() const { return response_ != nullptr; }
  TRITONBACKEND_Response* get() const { return response_; }

  // Sends the response, with `error` (owned by us, freed here) if not null.
  void Send(TRITONSERVER_Error* error) {
    const OwnedError owned(error);
    if (response_ == nullptr) return;
    TRITONBACKEND_Response* response = response_;
    response_ = nullptr;  // ownership passes to Triton even if sending fails
    LogIfError(TRITONBACKEND_ResponseSend(response, api::kResponseCompleteFinal, error),
               "sending a response");
  }

  // Allocates a CPU output buffer for a tensor.
  char* Output(const char* name, std::int32_t datatype, const std::vector<std::int64_t>& shape,
               std::size_t byte_size) {
    TRITONBACKEND_Output* output = nullptr;
    Check(TRITONBACKEND_ResponseOutput(response_, &output, name, datatype, shape.data(),
                                       static_cast<std::uint32_t>(shape.size())),
          "creating an output tensor");
    void* buffer = nullptr;
    std::int32_t memory_type = api::kMemoryCpu;
    std::int64_t memory_type_id = 0;
    Check(TRITONBACKEND_OutputBuffer(output, &buffer, byte_size, &memory_type, &memory_type_id),
          "allocating an output buffer");
    if (byte_size > 0 && memory_type != api::kMemoryCpu && memory_type != api::kMemoryCpuPinned) {
      throw BackendError(api::kErrorUnsupported, std::string("output '") + name +
                                                     "' was not given CPU memory");
    }
    return static_cast<char*>(buffer);
  }

 private:
  TRITONBACKEND_Response* response_ = nullptr;
};

struct InputTensor {
  std::int32_t datatype = 0;
  std::vector<std::int64_t> shape;
  std::string data;  // the buffers, gathered (inputs may arrive in several pieces)
};

// An input of the one datatype its role takes (type_text names it in the error).
InputTensor ReadInput(TRITONBACKEND_Request* request, const char* name, std::int32_t datatype,
                      const char* type_text) {
  TRITONBACKEND_Input* input = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_RequestInput(request, name, &input);
  if (error != nullptr) {
    const OwnedError owned(error);
    throw BackendError(api::kErrorInvalidArg, std::string("input '") + name + "' is missing");
  }
  InputTensor tensor;
  const std::int64_t* shape = nullptr;
  std::uint32_t dims = 0;
  std::uint64_t byte_size = 0;
  std::uint32_t buffers = 0;
  Check(TRITONBACKEND_InputProperties(input, nullptr, &tensor.datatype, &shape, &dims, &byte_size,
                                      &buffers),
        "reading input properties");
  if (tensor.datatype != datatype) {
    throw BackendError(api::kErrorInvalidArg,
                       std::string("input '") + name + "' must be " + type_text);
  }
  tensor.shape.assign(shape, shape + dims);
  tensor.data.reserve(byte_size);
  for (std::uint32_t b = 0; b < buffers; ++b) {
    const void* buffer = nullptr;
    std::uint64_t size = 0;
    std::int32_t memory_type = api::kMemoryCpu;
    std::int64_t memory_type_id = 0;
    Check(TRITONBACKEND_InputBuffer(input, b, &buffer, &size, &memory_type, &memory_type_id),
          "reading an input buffer");
    if (memory_type != api::kMemoryCpu && memory_type != api::kMemoryCpuPinned) {
      throw BackendError(api::kErrorUnsupported,
                         std::string("input '") + name + "' is not in CPU memory");
    }
    tensor.data.append(static_cast<const char*>(buffer), size);
  }
  return tensor;
}

std::string ShapeText(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Rows of a request: its batch dimension when the model batches, else one.
std::size_t RowCount(const ModelState& model, const InputTensor& tensor, const char* name,
                     std::size_t row_rank) {
  const std::size_t rank = row_rank + (model.batching() ? 1 : 0);
  if (tensor.shape.size() != rank) {
    throw BackendError(api::kErrorInvalidArg, std::string("input '") + name + "' has shape " +
                                                  ShapeText(tensor.shape) + ", expected " +
                                                  std::to_string(rank) + " dimensions");
  }
  return model.batching() ? static_cast<std::size_t>(tensor.shape[0]) : 1;
}

std::vector<std::string_view> ParseStrings(const InputTensor& tensor, std::size_t count,
                                           const char* name) {
  std::vector<std::string_view> strings;
  std::size_t offset = 0;
  const std::string& data = tensor.data;
  for (std::size_t i = 0; i < count; ++i) {
    if (data.size() - offset < 4) {
      throw BackendError(api::kErrorInvalidArg, std::string("input '") + name +
                                                    "' holds fewer strings than its shape says");
    }
    std::uint32_t length = 0;
    for (int b = 3; b >= 0; --b) length = (length << 8) | static_cast<unsigned char>(data[offset + b]);
    offset += 4;
    if (data.size() - offset < length) {
      throw BackendError(api::kErrorInvalidArg, std::string("input '") + name + "' element " +
                                                    std::to_string(i) + " is truncated");
    }
    strings.emplace_back(data.data() + offset, length);
    offset += length;
  }
  if (offset != data.size()) {
    throw BackendError(api::kErrorInvalidArg, std::string("input '") + name +
                                                  "' holds more data than its shape says");
  }
  return strings;
}

// A request-level override of a boolean model parameter.
bool RequestFlag(TRITONBACKEND_Request* request, const char* key, bool fallback) {
  std::uint32_t count = 0;
  Check(TRITONBACKEND_RequestParameterCount(request, &count), "reading request parameters");
  for (std::uint32_t i = 0; i < count; ++i) {
    const char* name = nullptr;
    std::int32_t type = 0;
    const void* value = nullptr;
    Check(TRITONBACKEND_RequestParameter(request, i, &name, &type, &value),
          "reading a request parameter");
    if (std::strcmp(name, key) != 0) continue;
    if (type == api::kParameterBool) return *static_cast<const bool*>(value);
    if (type == api::kParameterString) return ParseBool(key, static_cast<const char*>(value));
    if (type == api::kParameterInt) return *static_cast<const std::int64_t*>(value) != 0;
    throw BackendError(api::kErrorInvalidArg,
                       std::string("request parameter '") + key + "' must be a boolean");
  }
  return fallback;
}

bool OutputRequested(TRITONBACKEND_Request* request, const char* name) {
  std::uint32_t count = 0;
  Check(TRITONBACKEND_RequestOutputCount(request, &count), "reading requested outputs");
  for (std::uint32_t i = 0; i < count; ++i) {
    const char* requested = nullptr;
    Check(TRITONBACKEND_RequestOutputName(request, i, &requested), "reading an output name");
    if (std::strcmp(requested, name) == 0) return true;
  }
  return count == 0;
}

struct Timing {
  std::uint64_t compute_start = 0;
  std::uint64_t compute_end = 0;
  std::uint64_t rows = 0;  // the request's batch size, for the batch statistics
};

void Encode(const ModelState& model, TRITONBACKEND_Request* request, ResponseHandle* response,
            Timing* timing) {
  const InputTensor input = ReadInput(request, kTextInput.name, api::kTypeBytes, "BYTES");
  const std::size_t rows = RowCount(model, input, kTextInput.name, 1);
  if (input.shape.back() != 1) {
    throw BackendError(api::kErrorInvalidArg, "input 'text_input' has shape " +
                                                  ShapeText(input.shape) +
                                                  ", expected one string per row");
  }
  const auto texts = ParseStrings(input, rows, kTextInput.name);
  const bool add_special = RequestFlag(request, "add_special_tokens", model.add_special_tokens());

  timing->rows = rows;
  timing->compute_start = NowNs();
  std::vector<std::vector<TokenId>> ids(rows);
  std::size_t longest = 0;
  for (std::size_t row = 0; row < rows; ++row) {
    try {
      ids[row] = model.tokenizer().Encode(texts[row], add_special);
    } catch (const tritonforge_tokenizer::InputError& e) {
      throw BackendError(api::kErrorInvalidArg,
                         "text_input[" + std::to_string(row) + "]: " + e.what());
    }
    longest = std::max(longest, ids[row].size());
  }
  timing->compute_end = NowNs();

  const auto batch = static_cast<std::int64_t>(rows);
  if (OutputRequested(request, kInputIds.name)) {
    std::vector<std::int64_t> shape{static_cast<std::int64_t>(longest)};
    if (model.batching()) shape.insert(shape.begin(), batch);
    const std::size_t bytes = rows * longest * sizeof(std::int32_t);
    char* out = response->Output(kInputIds.name, api::kTypeInt32, shape, bytes);
    for (std::size_t row = 0; row < rows; ++row) {
      std::vector<std::int32_t> padded(longest, model.pad_id());
      std::copy(ids[row].begin(), ids[row].end(), padded.begin());
      if (longest > 0) std::memcpy(out + row * longest * 4, padded.data(), longest * 4);
    }
  }
  if (OutputRequested(request, kInputLengths.name)) {
    std::vector<std::int64_t> shape{1};
    if (model.batching()) shape.insert(shape.begin(), batch);
    char* out = response->Output(kInputLengths.name, api::kTypeInt32, shape, rows * 4);
    for (std::size_t row = 0; row < rows; ++row) {
      const auto length = static_cast<std::int32_t>(ids[row].size());
      std::memcpy(out + row * 4, &length, 4);
    }
  }
}

void Decode(const ModelState& model, TRITONBACKEND_Request* request, ResponseHandle* response,
            Timing* timing) {
  const InputTensor input = ReadInput(request, kOutputIds.name, api::kTypeInt32, "INT32");
  const std::size_t rows = RowCount(model, input, kOutputIds.name, 1);
  const auto width = static_cast<std::size_t>(input.shape.back());
  if (input.data.size() != rows * width * 4) {
    throw BackendError(api::kErrorInvalidArg, "input 'output_ids' holds " +
                                                  std::to_string(input.data.size()) +
                                                  " bytes, its shape " + ShapeText(input.shape) +
                                                  " needs " + std::to_string(rows * width * 4));
  }
  const bool skip_special =
      RequestFlag(request, "skip_special_tokens", model.skip_special_tokens());

  timing->rows = rows;
  timing->compute_start = NowNs();
  std::vector<std::string> texts(rows);
  std::vector<TokenId> ids(width);
  for (std::size_t row = 0; row < rows; ++row) {
    for (std::size_t col = 0; col < width; ++col) {
      std::int32_t value;
      std::memcpy(&value, input.data.data() + (row * width + col) * 4, 4);
      if (value < 0 || !model.tokenizer().HasId(static_cast<TokenId>(value))) {
        throw BackendError(api::kErrorInvalidArg,
                           "output_ids[" + std::to_string(row) + "][" + std::to_string(col) +
                               "]: token id " + std::to_string(value) +
                               " is not in the vocabulary (size " +
                               std::to_string(model.tokenizer().VocabSize()) + ")");
      }
      ids[col] = static_cast<TokenId>(value);
    }
    texts[row] = model.tokenizer().Decode(ids, skip_special);
  }
  timing->compute_end = NowNs();

  if (!OutputRequested(request, kTextOutput.name)) return;
  std::vector<std::int64_t> shape{1};
  if (model.batching()) shape.insert(shape.begin(), static_cast<std::int64_t>(rows));
  std::size_t bytes = 0;
  for (const std::string& text : texts) bytes += 4 + text.size();
  char* out = response->Output(kTextOutput.name, api::kTypeBytes, shape, bytes);
  for (const std::string& text : texts) {
    const auto length = static_cast<std::uint32_t>(text.size());
    for (int b = 0; b < 4; ++b) *out++ = static_cast<char>((length >> (8 * b)) & 0xFF);
    std::memcpy(out, text.data(), text.size());
    out += text.size();
  }
}

}  // namespace

TRITONFORGE_EXPORT TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) {
  std::uint32_t major = 0;
  std::uint32_t minor = 0;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ApiVersion(&major, &minor)) return error;
  if (major != api::kApiMajor || minor < api::kApiMinMinor) {
    return ToTritonError(api::kErrorUnsupported,
                         "tokenizer backend needs Triton backend API " +
                             std::to_string(api::kApiMajor) + "." +
                             std::to_string(api::kApiMinMinor) + " or a later 1.x, server has " +
                             std::to_string(major) + "." + std::to_string(minor));
  }
  return nullptr;
}

TRITONFORGE_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  try {
    auto state = std::make_unique<ModelState>(model);
    if (TRITONSERVER_Error* error = TRITONBACKEND_ModelSetState(model, state.get())) return error;
    state.release();
    return nullptr;
  } catch (const BackendError& e) {
    return ToTritonError(e.code(), e.what());
  } catch (const json::exception& e) {
    return ToTritonError(api::kErrorInvalidArg, std::string("model config: ") + e.what());
  } catch (const std::exception& e) {
    return ToTritonError(api::kErrorInternal, e.what());
  }
}

TRITONFORGE_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelState(model, &state)) return error;
  delete static_cast<ModelState*>(state);
  return nullptr;
}

TRITONFORGE_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests,
    const std::uint32_t request_count) {
  // From here on the requests are ours: nothing below may return an error or throw.
  const std::uint64_t exec_start = NowNs();
  std::vector<std::unique_ptr<RequestHandle>> owned;
  owned.reserve(request_count);
  for (std::uint32_t r = 0; r < request_count; ++r) {
    owned.push_back(std::make_unique<RequestHandle>(requests[r]));
  }
  ModelState* model = nullptr;
  TRITONBACKEND_Model* triton_model = nullptr;
  void* state = nullptr;
  LogIfError(TRITONBACKEND_ModelInstanceModel(instance, &triton_model), "finding the model");
  if (triton_model != nullptr) {
    LogIfError(TRITONBACKEND_ModelState(triton_model, &state), "reading the model state");
  }
  model = static_cast<ModelState*>(state);

  std::uint64_t batch_rows = 0;
  std::uint64_t compute_start = 0;
  std::uint64_t compute_end = 0;
  for (const auto& handle : owned) {
    TRITONBACKEND_Request* request = handle->get();
    const std::uint64_t request_start = NowNs();
    ResponseHandle response(request);
    Timing timing;
    TRITONSERVER_Error* error = nullptr;
    try {
      if (model == nullptr) throw BackendError(api::kErrorInternal, "model state is missing");
      if (!response.valid()) throw BackendError(api::kErrorInternal, "no response object");
      if (model->role() == Role::kEncode) {
        Encode(*model, request, &response, &timing);
      } else {
        Decode(*model, request, &response, &timing);
      }
      batch_rows += timing.rows;
    } catch (const BackendError& e) {
      error = ToTritonError(e.code(), e.what());
    } catch (const std::exception& e) {
      error = ToTritonError(api::kErrorInternal, e.what());
    }
    // As Triton's own backends do, execution ends once the outputs are filled; sending
    // (handing the response to the frontend) is not part of it.
    const std::uint64_t request_end = NowNs();
    response.Send(error);
    if (timing.compute_start == 0) timing.compute_start = timing.compute_end = request_end;
    if (compute_start == 0) compute_start = timing.compute_start;
    compute_end = timing.compute_end;
    LogIfError(TRITONBACKEND_ModelInstanceReportStatistics(
                   instance, request, error == nullptr, request_start, timing.compute_start,
                   timing.compute_end, request_end),
               "reporting request statistics");
  }
  if (batch_rows > 0) {
    LogIfError(TRITONBACKEND_ModelInstanceReportBatchStatistics(
                   instance, batch_rows, exec_start, compute_start, compute_end, NowNs()),
               "reporting batch statistics");
  }
  return nullptr;  // `owned` releases every request on the way out
}
