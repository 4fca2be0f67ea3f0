// The report envelope shared by every `strata eval` command (docs/eval.md, eval/report_schema.json)
// and a validator for the subset of JSON Schema that schema uses.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace strata::eval {

inline constexpr int kReportSchemaVersion = 1;

// {"schema_version", "command", "model": {...}, "elapsed_s", "notes": [], "warnings": [],
// "skipped": [], COMMAND: section}. `section` goes under the key named by `command` ("needle",
// "ppl" or "kl"); `warnings` are the achieved-compression warnings (kv/achieved.h) of its configs.
nlohmann::json MakeReport(const std::string& command, const std::string& model_path,
                          const Model& model, double elapsed_s,
                          const std::vector<std::string>& notes, nlohmann::json skipped,
                          nlohmann::json section, const std::vector<std::string>& warnings = {});

// Validates `doc` against `schema`, supporting: type (a name or a list of names: object, array,
// string, number, integer, boolean, null), required, properties, additionalProperties (false or
// a schema), items, enum, const, minimum, maximum, minItems, $ref to "#/definitions/NAME" and
// "#/$defs/NAME", allOf, anyOf, oneOf. Unknown keywords are ignored. The error names the JSON
// pointer of the first bad value and what was expected.
Status ValidateJsonSchema(const nlohmann::json& schema, const nlohmann::json& doc);

}  // namespace strata::eval
