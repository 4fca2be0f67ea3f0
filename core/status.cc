#include "core/status.h"

namespace strata {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kIoError: return "IO_ERROR";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

Status InvalidArgument(std::string msg) { return Status(StatusCode::kInvalidArgument, std::move(msg)); }
Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
Status DataLoss(std::string msg) { return Status(StatusCode::kDataLoss, std::move(msg)); }
Status Unimplemented(std::string msg) { return Status(StatusCode::kUnimplemented, std::move(msg)); }
Status OutOfRange(std::string msg) { return Status(StatusCode::kOutOfRange, std::move(msg)); }
Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }
Status IoError(std::string msg) { return Status(StatusCode::kIoError, std::move(msg)); }

}  // namespace strata
