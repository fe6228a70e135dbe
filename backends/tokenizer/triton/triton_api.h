// The part of the Triton server / backend C API this backend uses, declared here because
// no package ships Triton's headers (and the project does not copy them in). Handles are
// opaque; enums are passed as the 32-bit integers the C enums are.
//
// Every declaration and value below is checked against the pinned release (Triton 2.51,
// core tag r24.10; TRITONBACKEND API 1.19): triton_api.reference.json records what that
// release publishes, and api_check.py compiles static_asserts comparing the two
// (tests/unit/test_tokenizer_triton_api.py; CMake -DTRITONFORGE_BUILD_TESTS=ON). Declare
// something new here, or change anything, and the reference must say the same.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct TRITONSERVER_Error;
struct TRITONSERVER_Message;
struct TRITONBACKEND_Backend;
struct TRITONBACKEND_Model;
struct TRITONBACKEND_ModelInstance;
struct TRITONBACKEND_Request;
struct TRITONBACKEND_Response;
struct TRITONBACKEND_Input;
struct TRITONBACKEND_Output;

TRITONSERVER_Error* TRITONSERVER_ErrorNew(std::int32_t code, const char* message);
void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error);
const char* TRITONSERVER_ErrorMessage(TRITONSERVER_Error* error);
TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message* message,
                                                       const char** base, std::size_t* byte_size);
TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message);
TRITONSERVER_Error* TRITONSERVER_LogMessage(std::int32_t level, const char* filename, int line,
                                            const char* message);

TRITONSERVER_Error* TRITONBACKEND_ApiVersion(std::uint32_t* major, std::uint32_t* minor);
TRITONSERVER_Error* TRITONBACKEND_ModelName(TRITONBACKEND_Model* model, const char** name);
TRITONSERVER_Error* TRITONBACKEND_ModelRepository(TRITONBACKEND_Model* model,
                                                  std::int32_t* artifact_type,
                                                  const char** location);
TRITONSERVER_Error* TRITONBACKEND_ModelConfig(TRITONBACKEND_Model* model,
                                              std::uint32_t config_version,
                                              TRITONSERVER_Message** model_config);
TRITONSERVER_Error* TRITONBACKEND_ModelSetState(TRITONBACKEND_Model* model, void* state);
TRITONSERVER_Error* TRITONBACKEND_ModelState(TRITONBACKEND_Model* model, void** state);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance* instance,
                                                     TRITONBACKEND_Model** model);

TRITONSERVER_Error* TRITONBACKEND_RequestInput(TRITONBACKEND_Request* request, const char* name,
                                               TRITONBACKEND_Input** input);
TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input* input, const char** name,
                                                  std::int32_t* datatype,
                                                  const std::int64_t** shape,
                                                  std::uint32_t* dims_count,
                                                  std::uint64_t* byte_size,
                                                  std::uint32_t* buffer_count);
TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input, std::uint32_t index,
                                              const void** buffer,
                                              std::uint64_t* buffer_byte_size,
                                              std::int32_t* memory_type,
                                              std::int64_t* memory_type_id);
TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request* request,
                                                     std::uint32_t* count);
TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(TRITONBACKEND_Request* request,
                                                    std::uint32_t index, const char** name);
TRITONSERVER_Error* TRITONBACKEND_RequestParameterCount(TRITONBACKEND_Request* request,
                                                        std::uint32_t* count);
TRITONSERVER_Error* TRITONBACKEND_RequestParameter(TRITONBACKEND_Request* request,
                                                   std::uint32_t index, const char** key,
                                                   std::int32_t* type, const void** value);
TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* request,
                                                 std::uint32_t release_flags);

TRITONSERVER_Error* TRITONBACKEND_ResponseNew(TRITONBACKEND_Response** response,
                                              TRITONBACKEND_Request* request);
TRITONSERVER_Error* TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response* response);
TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response* response,
                                                 TRITONBACKEND_Output** output, const char* name,
                                                 std::int32_t datatype, const std::int64_t* shape,
                                                 std::uint32_t dims_count);
TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output* output, void** buffer,
                                               std::uint64_t buffer_byte_size,
                                               std::int32_t* memory_type,
                                               std::int64_t* memory_type_id);
TRITONSERVER_Error* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response* response,
                                               std::uint32_t send_flags,
                                               TRITONSERVER_Error* error);

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, bool success,
    std::uint64_t exec_start_ns, std::uint64_t compute_start_ns, std::uint64_t compute_end_ns,
    std::uint64_t exec_end_ns);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(
    TRITONBACKEND_ModelInstance* instance, std::uint64_t batch_size, std::uint64_t exec_start_ns,
    std::uint64_t compute_start_ns, std::uint64_t compute_end_ns, std::uint64_t exec_end_ns);

// Entry points Triton calls, defined in backend.cpp (declared here so that their
// signatures are checked with the rest).
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend);
TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model);
TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       std::uint32_t request_count);

}  // extern "C"

namespace triton_api {

// TRITONSERVER_Error_Code
constexpr std::int32_t kErrorInternal = 1;
constexpr std::int32_t kErrorNotFound = 2;
constexpr std::int32_t kErrorInvalidArg = 3;
constexpr std::int32_t kErrorUnsupported = 5;
// TRITONSERVER_DataType
constexpr std::int32_t kTypeInt32 = 8;
constexpr std::int32_t kTypeBytes = 13;
// TRITONSERVER_MemoryType
constexpr std::int32_t kMemoryCpu = 0;
constexpr std::int32_t kMemoryCpuPinned = 1;
// TRITONSERVER_ParameterType
constexpr std::int32_t kParameterString = 0;
constexpr std::int32_t kParameterInt = 1;
constexpr std::int32_t kParameterBool = 2;
// TRITONSERVER_LogLevel
constexpr std::int32_t kLogInfo = 0;
constexpr std::int32_t kLogWarn = 1;
constexpr std::int32_t kLogError = 2;
// Flags
constexpr std::uint32_t kResponseCompleteFinal = 1;
constexpr std::uint32_t kRequestReleaseAll = 1;
// Backend API version this backend needs (request parameters, statistics as used here).
constexpr std::uint32_t kApiMajor = 1;
constexpr std::uint32_t kApiMinMinor = 19;

}  // namespace triton_api
