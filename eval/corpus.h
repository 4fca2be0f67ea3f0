// The built-in haystack for needle trials: public-domain text compiled into the binary, so
// `strata eval needle` runs without a corpus file.
#pragma once

#include <string_view>

namespace strata::eval {

// About 11 KB of the King James Version (1611, public domain): Genesis 1-2, Ecclesiastes
// 3:1-15 and Psalm 104:1-24, one verse per line, verse numbers removed (from Debian's
// bible-kjv-text). Also the filler language of the repo's char-level testbed models.
std::string_view BuiltinHaystack();
inline constexpr std::string_view kBuiltinHaystackName = "builtin:kjv-genesis";

}  // namespace strata::eval
