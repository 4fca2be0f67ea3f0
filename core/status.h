// Status / StatusOr: error values returned across every boundary (files, config, budgets, requests).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace strata {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a bad flag, budget or request
  kNotFound,         // missing file, tensor or metadata key
  kDataLoss,         // corrupt or truncated file
  kUnimplemented,    // valid input this engine does not support (e.g. a tensor type)
  kOutOfRange,       // a value outside what the format allows
  kInternal,         // a bug
  kIoError,          // the OS refused (open, read, write, mmap)
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: --ratio must be >= 1, got 0.5"
  std::string ToString() const;
  // Returns a copy whose message is "context: message".
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status InvalidArgument(std::string msg);
Status NotFound(std::string msg);
Status DataLoss(std::string msg);
Status Unimplemented(std::string msg);
Status OutOfRange(std::string msg);
Status Internal(std::string msg);
Status IoError(std::string msg);

// Holds either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : v_(status) {  // NOLINT: implicit by design
    if (status.ok()) v_ = Status(StatusCode::kInternal, "StatusOr built from OK status");
  }
  StatusOr(Status&& status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "StatusOr built from OK status");
  }
  StatusOr(const T& value) : v_(value) {}  // NOLINT
  StatusOr(T&& value) : v_(std::move(value)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  T& value() & { CheckOk(); return std::get<T>(v_); }
  const T& value() const& { CheckOk(); return std::get<T>(v_); }
  T&& value() && { CheckOk(); return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const {
    if (!ok()) {
      std::fprintf(stderr, "StatusOr::value() on error: %s\n", status().ToString().c_str());
      std::abort();
    }
  }
  std::variant<Status, T> v_;
};

}  // namespace strata

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                       \
  do {                                              \
    ::strata::Status _st = (expr);                  \
    if (!_st.ok()) return _st;                      \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(STRATA_CONCAT(_statusor_, __LINE__), lhs, expr)
