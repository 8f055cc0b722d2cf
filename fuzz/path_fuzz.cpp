// Fuzzes path parsing and the path rules' relations against a reference on strings.
//
// Input: byte 0 chooses the modes (bit 0: the first rule is shared, bit 1: the second), byte 1 the
// length of the first path (modulo what is left); the rest is the second path. For each path:
// rules::path / read_path either throws InvalidPath or gives the path a plain string-based
// normaliser gives (absolute, '/' runs folded, "." dropped, ".." pops, NUL and ".." above the root
// rejected), and that normalised path parses to itself. For two valid rules: conflict and
// containment agree with the string definitions (an exclusive rule contains whatever is at or
// under its path; a shared one only shared rules there; related paths conflict unless both are
// shared), and conflict is symmetric.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "tasklet/error.hpp"
#include "tasklet/rules/path_rule.hpp"

namespace {

// The reference: one pass over the bytes, building the result as a string and cutting the last
// segment off it for "..". Independent of PathRule's segment vector on purpose.
std::optional<std::string> reference_normalize(std::string_view input) {
  if (input.empty() || input.front() != '/' || input.find('\0') != std::string_view::npos)
    return std::nullopt;
  std::string out;  // "" stands for the root while building; segments each start with '/'
  std::string segment;
  const auto flush = [&]() -> bool {
    if (segment.empty() || segment == ".") {
    } else if (segment == "..") {
      if (out.empty()) return false;
      out.erase(out.rfind('/'));
    } else {
      out += '/';
      out += segment;
    }
    segment.clear();
    return true;
  };
  for (const char c : input) {
    if (c == '/') {
      if (!flush()) return std::nullopt;
    } else {
      segment += c;
    }
  }
  if (!flush()) return std::nullopt;
  return out.empty() ? std::string("/") : out;
}

// Whether `ancestor` is `descendant` or one of its ancestors, on normalised strings.
bool at_or_above(const std::string& ancestor, const std::string& descendant) {
  if (ancestor == "/" || ancestor == descendant) return true;
  return descendant.size() > ancestor.size() && descendant.compare(0, ancestor.size(), ancestor) == 0 &&
         descendant[ancestor.size()] == '/';
}

// libFuzzer keeps the input that aborts, and the message says which check failed.
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "path_fuzz: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) fail(what);
}

// Parses `input` both ways and checks they agree; the rule when it is valid.
std::optional<tasklet::PathRule> parse(std::string_view input, bool shared) {
  const std::optional<std::string> expected = reference_normalize(input);
  const auto mode = shared ? tasklet::PathRule::Mode::shared : tasklet::PathRule::Mode::exclusive;
  try {
    tasklet::PathRule rule(input, mode);
    check(expected.has_value(), "accepted a path the reference rejects");
    check(rule.path() == *expected, "normalised differently from the reference");
    check(tasklet::PathRule::normalize(input) == rule.path(), "normalize() disagrees with the rule");
    const tasklet::PathRule again(rule.path(), mode);
    check(again.path() == rule.path(), "a normalised path does not parse to itself");
    check(rule.is_shared() == shared, "lost its mode");
    return rule;
  } catch (const tasklet::InvalidPath& error) {
    check(!expected.has_value(), "rejected a path the reference accepts");
    check(std::string_view(error.what()).find("invalid path") != std::string_view::npos,
          "InvalidPath does not say what it rejects");
    return std::nullopt;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const bool a_shared = (data[0] & 1u) != 0;
  const bool b_shared = (data[0] & 2u) != 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  const std::size_t split = rest.empty() ? 0 : data[1] % (rest.size() + 1);
  const std::optional<tasklet::PathRule> a = parse(rest.substr(0, split), a_shared);
  const std::optional<tasklet::PathRule> b = parse(rest.substr(split), b_shared);
  if (!a || !b) return 0;
  const bool related = at_or_above(a->path(), b->path()) || at_or_above(b->path(), a->path());
  check(a->is_conflicting(*b) == (related && !(a_shared && b_shared)), "conflict differs from the reference");
  check(a->is_conflicting(*b) == b->is_conflicting(*a), "conflict is not symmetric");
  check(a->contains(*b) == (at_or_above(a->path(), b->path()) && (!a_shared || b_shared)),
        "containment differs from the reference");
  check(a->is_ancestor_or_equal_of(*b) == at_or_above(a->path(), b->path()),
        "ancestry differs from the reference");
  return 0;
}
