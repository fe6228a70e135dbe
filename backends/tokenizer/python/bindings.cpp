// pybind11 front end over the tokenizer core: conversions only, GIL released while the
// core works so Python threads (and the Triton Python backend) can tokenize in parallel.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "tritonforge_tokenizer/tokenizer.h"

namespace py = pybind11;
namespace tt = tritonforge_tokenizer;

namespace {

std::vector<tt::TokenId> ToIds(const py::sequence& ids) {
  std::vector<tt::TokenId> out;
  out.reserve(py::len(ids));
  for (const py::handle item : ids) {
    const long long value = item.cast<long long>();
    if (value < 0 || value > 0xFFFFFFFFLL) {
      throw tt::InputError("token id " + std::to_string(value) + " is out of range");
    }
    out.push_back(static_cast<tt::TokenId>(value));
  }
  return out;
}

// UTF-8 of a Python str; a str with lone surrogates has none, which is bad input.
std::string Utf8(const py::handle& text, const char* what) {
  if (!PyUnicode_Check(text.ptr())) throw py::type_error(std::string(what) + " must be str");
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
  if (data == nullptr) {
    PyErr_Clear();
    throw tt::InputError(std::string(what) +
                         " is not valid Unicode (it contains a lone surrogate)");
  }
  return std::string(data, static_cast<std::size_t>(size));
}

py::str Text(const std::string& text) {
  return py::reinterpret_steal<py::str>(
      PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "strict"));
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "HF tokenizers-exact byte-level BPE tokenizer (C++ core of tritonforge)";

  auto base = py::register_exception<tt::TokenizerError>(m, "TokenizerError", PyExc_ValueError);
  py::register_exception<tt::LoadError>(m, "TokenizerLoadError", base);
  py::register_exception<tt::InputError>(m, "TokenizerInputError", base);

  py::class_<tt::Tokenizer>(m, "Tokenizer")
      .def_static(
          "from_file",
          [](const std::string& path) {
            py::gil_scoped_release release;
            return tt::Tokenizer::FromFile(path);
          },
          py::arg("path"))
      .def_static(
          "from_str",
          [](const std::string& json) {
            py::gil_scoped_release release;
            return tt::Tokenizer::FromJson(json, "<string>");
          },
          py::arg("json"))
      .def(
          "encode",
          [](const tt::Tokenizer& self, const py::handle& text, bool add_special_tokens) {
            const std::string utf8 = Utf8(text, "text");
            std::vector<tt::TokenId> ids;
            {
              py::gil_scoped_release release;
              ids = self.Encode(utf8, add_special_tokens);
            }
            return ids;
          },
          py::arg("text"), py::arg("add_special_tokens") = true)
      .def(
          "encode_batch",
          [](const tt::Tokenizer& self, const py::sequence& items, bool add_special_tokens,
             unsigned threads) {
            std::vector<std::string> texts;
            texts.reserve(py::len(items));
            for (const py::handle item : items) {
              texts.push_back(Utf8(item, ("text " + std::to_string(texts.size())).c_str()));
            }
            std::vector<std::vector<tt::TokenId>> ids;
            {
              py::gil_scoped_release release;
              ids = self.EncodeBatch(texts, add_special_tokens, threads);
            }
            return ids;
          },
          py::arg("texts"), py::arg("add_special_tokens") = true, py::arg("threads") = 0)
      .def(
          "decode",
          [](const tt::Tokenizer& self, const py::sequence& ids, bool skip_special_tokens) {
            const std::vector<tt::TokenId> values = ToIds(ids);
            std::string text;
            {
              py::gil_scoped_release release;
              text = self.Decode(values, skip_special_tokens);
            }
            return Text(text);
          },
          py::arg("ids"), py::arg("skip_special_tokens") = true)
      .def_property_readonly("vocab_size", &tt::Tokenizer::VocabSize)
      .def("token_to_id", &tt::Tokenizer::TokenToId, py::arg("token"))
      .def("id_to_token", &tt::Tokenizer::IdToToken, py::arg("id"))
      .def("is_special", &tt::Tokenizer::IsSpecial, py::arg("id"))
      .def(
          "incremental_decoder",
          [](const tt::Tokenizer& self, bool skip_special_tokens) {
            return tt::IncrementalDecoder(self, skip_special_tokens);
          },
          py::arg("skip_special_tokens") = true);

  py::class_<tt::IncrementalDecoder>(m, "IncrementalDecoder")
      .def(
          "add",
          [](tt::IncrementalDecoder& self, tt::TokenId id) { return Text(self.Add(id)); },
          py::arg("id"))
      .def(
          "add_many",
          [](tt::IncrementalDecoder& self, const py::sequence& ids) {
            const std::vector<tt::TokenId> values = ToIds(ids);
            return Text(self.Add(values.data(), values.size()));
          },
          py::arg("ids"))
      .def("finish", [](tt::IncrementalDecoder& self) { return Text(self.Finish()); })
      .def_property_readonly("pending_bytes", &tt::IncrementalDecoder::pending_bytes);
}
