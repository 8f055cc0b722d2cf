// PathRule: normalisation, hierarchical conflicts and containment, read/write modes.
#include "tasklet/rules/path_rule.hpp"

#include <gtest/gtest.h>

#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tasklet/error.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

using namespace std::string_literals;

const PathRule& as_path(const Rule& rule) { return dynamic_cast<const PathRule&>(*rule); }

std::vector<std::string> segments_of(const Rule& rule) {
  const auto segments = as_path(rule).segments();
  return {segments.begin(), segments.end()};
}

// --- normalisation ---------------------------------------------------------------------------

struct NormalCase {
  std::string input;
  std::string expected;
};

TEST(PathRuleTest, NormalisesAsDocumented) {
  const std::vector<NormalCase> cases = {
      {"/", "/"},
      {"//", "/"},
      {"///", "/"},
      {"/a", "/a"},
      {"/a/", "/a"},
      {"/a//", "/a"},
      {"//a//b///c//", "/a/b/c"},
      {"/.", "/"},
      {"/./a/./b/.", "/a/b"},
      {"/a/..", "/"},
      {"/a/../b", "/b"},
      {"/a/b/../c", "/a/c"},
      {"/a/b/c/../../d/", "/a/d"},
      {"/a/./../b", "/b"},
      {"/.../a", "/.../a"},          // only "." and ".." are special
      {"/.a/..b/a.", "/.a/..b/a."},  // dots inside names are ordinary
      {"/a\\b", "/a\\b"},            // a backslash is an ordinary byte
      {"/a b/ c ", "/a b/ c "},      // so is a space
  };
  for (const NormalCase& c : cases) {
    EXPECT_EQ(PathRule::normalize(c.input), c.expected) << "input: " << c.input;
    EXPECT_EQ(as_path(rules::path(c.input)).path(), c.expected) << "input: " << c.input;
    EXPECT_EQ(as_path(rules::read_path(c.input)).path(), c.expected) << "input: " << c.input;
  }
}

// A rule keeps only its path: a long input that normalises to a short path does not leave the
// rule holding room for the input (a short path then lives inside the string itself).
TEST(PathRuleTest, AShortNormalFormKeepsNoRoomForALongInput) {
  const std::string input = "/x" + std::string(60, '/') + "./y/z/..";
  const PathRule rule(input, PathRule::Mode::exclusive);
  EXPECT_EQ(rule.path(), "/x/y");
  EXPECT_LT(rule.path().capacity(), input.size());
  EXPECT_LT(PathRule::normalize(input).capacity(), input.size());
}

TEST(PathRuleTest, SegmentsAreSplitAndTheRootHasNone) {
  EXPECT_EQ(segments_of(rules::path("//a//b/./c/")), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(segments_of(rules::path("/")).empty());
  EXPECT_TRUE(segments_of(rules::path("/a/..")).empty());
}

TEST(PathRuleTest, RejectsEmptyInput) {
  try {
    (void)rules::path("");
    FAIL() << "expected InvalidPath";
  } catch (const InvalidPath& error) {
    EXPECT_NE(std::string(error.what()).find("\"\""), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("empty"), std::string::npos) << error.what();
  }
}

TEST(PathRuleTest, RejectsRelativeInputNamingIt) {
  for (const std::string input : {"a", "a/b", "./a", "../a", ".", " /a"}) {
    try {
      (void)rules::read_path(input);
      FAIL() << "expected InvalidPath for " << input;
    } catch (const InvalidPath& error) {
      EXPECT_NE(std::string(error.what()).find("\"" + input + "\""), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("absolute"), std::string::npos) << error.what();
    }
  }
}

TEST(PathRuleTest, RejectsDotDotAboveTheRoot) {
  for (const std::string input : {"/..", "/../a", "/a/../..", "/a/b/../../../c", "//./.."}) {
    try {
      (void)rules::path(input);
      FAIL() << "expected InvalidPath for " << input;
    } catch (const InvalidPath& error) {
      EXPECT_NE(std::string(error.what()).find("\"" + input + "\""), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("above the root"), std::string::npos) << error.what();
    }
  }
}

TEST(PathRuleTest, RejectsANulByteAndEscapesItInTheMessage) {
  const std::string input = "/a\0b"s;
  ASSERT_EQ(input.size(), 4U);
  try {
    (void)rules::path(input);
    FAIL() << "expected InvalidPath";
  } catch (const InvalidPath& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("\"/a\\x00b\""), std::string::npos) << what;
    EXPECT_NE(what.find("NUL"), std::string::npos) << what;
  }
}

TEST(PathRuleTest, InvalidPathIsAnInvalidRuleAndATaskletError) {
  EXPECT_THROW((void)rules::path("relative"), InvalidPath);
  EXPECT_THROW((void)rules::path("relative"), InvalidRule);
  EXPECT_THROW((void)rules::path("relative"), Error);
  EXPECT_THROW((void)rules::path("relative"), std::logic_error);
  EXPECT_THROW((void)PathRule::normalize("/.."), InvalidPath);
  EXPECT_THROW((void)PathRule("", PathRule::Mode::shared), InvalidPath);
}

TEST(PathRuleTest, LongInvalidInputIsShortenedInTheMessage) {
  std::string input(5000, 'x');
  try {
    (void)rules::path(input);
    FAIL() << "expected InvalidPath";
  } catch (const InvalidPath& error) {
    const std::string what = error.what();
    EXPECT_LT(what.size(), 400U);
    EXPECT_NE(what.find("xxxx"), std::string::npos) << what;
    EXPECT_NE(what.find("5000 bytes"), std::string::npos) << what;
  }
}

TEST(PathRuleTest, VeryDeepPathsWork) {
  constexpr int depth = 10000;
  std::string deep;
  std::string half;
  for (int i = 0; i < depth; ++i) {
    deep += "/s" + std::to_string(i % 7);
    if (i == depth / 2 - 1) half = deep;
  }
  const Rule rule = rules::path(deep);
  EXPECT_EQ(as_path(rule).segments().size(), static_cast<std::size_t>(depth));
  EXPECT_EQ(as_path(rule).path(), deep);

  const Rule ancestor = rules::path(half);
  const Rule sibling = rules::path(half + "/other");
  EXPECT_TRUE(ancestor->contains(*rule));
  EXPECT_FALSE(rule->contains(*ancestor));
  EXPECT_TRUE(ancestor->is_conflicting(*rule));
  EXPECT_TRUE(rule->is_conflicting(*ancestor));
  EXPECT_FALSE(sibling->is_conflicting(*rule));
  EXPECT_TRUE(rules::path(deep)->is_conflicting(*rule));

  // As many ".." as segments climb back to the root, one more is rejected.
  std::string climb = deep;
  for (int i = 0; i < depth; ++i) climb += "/..";
  EXPECT_EQ(PathRule::normalize(climb), "/");
  EXPECT_THROW((void)PathRule::normalize(climb + "/.."), InvalidPath);
}

TEST(PathRuleTest, UnicodeSegmentsAreOpaqueBytes) {
  const Rule turtle = rules::path("/żółw/日本/файл");
  EXPECT_EQ(segments_of(turtle), (std::vector<std::string>{"żółw", "日本", "файл"}));
  EXPECT_TRUE(rules::path("/żółw")->contains(*turtle));
  EXPECT_TRUE(rules::path("/żółw")->is_conflicting(*turtle));
  // "żół" is a byte prefix of "żółw" but a different segment.
  EXPECT_FALSE(rules::path("/żół")->is_conflicting(*turtle));
  // No Unicode normalisation: "é" precomposed (NFC) and decomposed (NFD) are different names.
  EXPECT_FALSE(rules::path("/caf\xC3\xA9")->is_conflicting(*rules::path("/cafe\xCC\x81")));
}

// --- exclusive (write) rules -----------------------------------------------------------------

TEST(PathRuleTest, SegmentPrefixIsNotAnAncestor) {
  const Rule ab = rules::path("/a/b");
  const Rule abc = rules::path("/a/bc");
  EXPECT_FALSE(ab->is_conflicting(*abc));
  EXPECT_FALSE(abc->is_conflicting(*ab));
  EXPECT_FALSE(ab->contains(*abc));
  EXPECT_FALSE(abc->contains(*ab));
  EXPECT_FALSE(as_path(ab).is_ancestor_or_equal_of(as_path(abc)));
  EXPECT_TRUE(as_path(ab).is_ancestor_or_equal_of(as_path(rules::path("/a/b/c"))));
}

TEST(PathRuleTest, DirectoryLockContainsAndConflictsWithItsFilesAndSubdirectories) {
  const Rule project = rules::path("/project");
  for (const char* inner : {"/project", "/project/src", "/project/src/a.cpp", "/project/docs/x/y/z"}) {
    const Rule rule = rules::path(inner);
    EXPECT_TRUE(project->contains(*rule)) << inner;
    EXPECT_TRUE(project->is_conflicting(*rule)) << inner;
    EXPECT_TRUE(rule->is_conflicting(*project)) << inner;
  }
  // ...but not the other way round, nor outside the directory.
  EXPECT_FALSE(rules::path("/project/src")->contains(*project));
  EXPECT_FALSE(project->contains(*rules::path("/projects")));
  EXPECT_FALSE(project->contains(*rules::path("/")));
  EXPECT_TRUE(project->is_conflicting(*rules::path("/")));
}

TEST(PathRuleTest, SiblingDirectoriesDoNotConflict) {
  const Rule src = rules::path("/project/src");
  const Rule docs = rules::path("/project/docs");
  EXPECT_FALSE(src->is_conflicting(*docs));
  EXPECT_FALSE(docs->is_conflicting(*src));
  EXPECT_FALSE(src->contains(*docs));
  EXPECT_FALSE(rules::path("/project/src/a.cpp")->is_conflicting(*rules::path("/project/src/b.cpp")));
}

TEST(PathRuleTest, RootIsAnAncestorOfEverything) {
  const Rule root = rules::path("/");
  for (const char* inner : {"/", "/a", "/a/b/c"}) {
    EXPECT_TRUE(root->contains(*rules::path(inner))) << inner;
    EXPECT_TRUE(root->contains(*rules::read_path(inner))) << inner;
    EXPECT_TRUE(root->is_conflicting(*rules::read_path(inner))) << inner;
  }
}

TEST(PathRuleTest, EqualPathsInDifferentObjectsAreEquivalent) {
  const Rule a1 = rules::path("/a/b");
  const Rule a2 = rules::write_path("//a/b/");
  EXPECT_TRUE(a1->is_conflicting(*a2));
  EXPECT_TRUE(a1->contains(*a2));
  EXPECT_TRUE(a2->contains(*a1));
}

// --- shared (read) rules ---------------------------------------------------------------------

TEST(PathRuleTest, ReadRulesNeverConflictWithEachOther) {
  const Rule read = rules::read_path("/data");
  EXPECT_FALSE(read->is_conflicting(*read));
  for (const char* other : {"/", "/data", "/data/x", "/other"}) {
    EXPECT_FALSE(read->is_conflicting(*rules::read_path(other))) << other;
    EXPECT_FALSE(rules::read_path(other)->is_conflicting(*read)) << other;
  }
}

TEST(PathRuleTest, ReadConflictsWithWritesAtAboveOrBelow) {
  const Rule read = rules::read_path("/data/set");
  for (const char* writer : {"/", "/data", "/data/set", "/data/set/part"}) {
    EXPECT_TRUE(read->is_conflicting(*rules::path(writer))) << writer;
    EXPECT_TRUE(rules::path(writer)->is_conflicting(*read)) << writer;
  }
  for (const char* writer : {"/data/other", "/data/settings", "/x"}) {
    EXPECT_FALSE(read->is_conflicting(*rules::path(writer))) << writer;
    EXPECT_FALSE(rules::path(writer)->is_conflicting(*read)) << writer;
  }
}

TEST(PathRuleTest, WriteContainsReadsAndWritesUnderIt) {
  const Rule write = rules::write_path("/data");
  EXPECT_TRUE(write->contains(*rules::read_path("/data")));
  EXPECT_TRUE(write->contains(*rules::read_path("/data/x")));
  EXPECT_TRUE(write->contains(*rules::write_path("/data/x")));
  EXPECT_FALSE(write->contains(*rules::read_path("/")));
}

TEST(PathRuleTest, ReadContainsOnlyReadsUnderIt) {
  const Rule read = rules::read_path("/data");
  EXPECT_TRUE(read->contains(*read));
  EXPECT_TRUE(read->contains(*rules::read_path("/data")));
  EXPECT_TRUE(read->contains(*rules::read_path("/data/x/y")));
  // No upgrade by nesting: a reader may not begin a write, not even on its own path.
  EXPECT_FALSE(read->contains(*rules::write_path("/data")));
  EXPECT_FALSE(read->contains(*rules::write_path("/data/x")));
  EXPECT_FALSE(read->contains(*rules::read_path("/")));
}

TEST(PathRuleTest, ModeAccessors) {
  EXPECT_FALSE(as_path(rules::path("/a")).is_shared());
  EXPECT_FALSE(as_path(rules::write_path("/a")).is_shared());
  EXPECT_TRUE(as_path(rules::read_path("/a")).is_shared());
  EXPECT_EQ(as_path(rules::read_path("/a")).mode(), PathRule::Mode::shared);
  EXPECT_EQ(as_path(rules::path("/a")).mode(), PathRule::Mode::exclusive);
}

// --- with other kinds ------------------------------------------------------------------------

TEST(PathRuleTest, ContainsAMultiRuleIffItContainsEveryChild) {
  const Rule a = rules::path("/a");
  const Rule inside = rules::combine(rules::path("/a/b"), rules::read_path("/a/c"));
  const Rule partly = rules::combine(rules::path("/a/b"), rules::path("/z"));
  const Rule with_mutex = rules::combine(rules::path("/a/b"), rules::mutex("m"));
  EXPECT_TRUE(a->contains(*inside));
  EXPECT_FALSE(a->contains(*partly));
  EXPECT_FALSE(a->contains(*with_mutex));
  EXPECT_FALSE(rules::read_path("/a")->contains(*inside));  // /a/b is a write
  EXPECT_TRUE(
      rules::read_path("/a")->contains(*rules::combine(rules::read_path("/a/b"), rules::read_path("/a/c"))));
}

TEST(PathRuleTest, ConflictsWithAMultiRuleWhenAChildDoes) {
  const Rule multi = rules::combine(rules::path("/x/y"), rules::mutex("m"));
  EXPECT_TRUE(rules::path("/x")->is_conflicting(*multi));
  EXPECT_TRUE(rules::read_path("/x/y/z")->is_conflicting(*multi));
  EXPECT_FALSE(rules::path("/z")->is_conflicting(*multi));
}

TEST(PathRuleTest, KeyDescribesThePath) {
  const Rule read = rules::read_path("/a/b");
  const RuleKey key = read->key();
  EXPECT_EQ(key.kind, RuleKey::Kind::path);
  EXPECT_TRUE(key.shared);
  EXPECT_EQ(key.path, "/a/b");
  EXPECT_EQ(std::vector<std::string>(PathSegments(key.path).begin(), PathSegments(key.path).end()),
            (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(key.name.empty());
  EXPECT_TRUE(key.children.empty());
  EXPECT_FALSE(rules::path("/")->key().shared);
  EXPECT_EQ(rules::path("/")->key().path, "/");
  EXPECT_TRUE(PathSegments(rules::path("/")->key().path).empty());
}

TEST(PathRuleTest, KeyRelationsMatchTheRules) {
  const Rule w = rules::path("/a");
  const Rule r = rules::read_path("/a/b");
  EXPECT_TRUE(PathRule::keys_conflict(w->key(), r->key()));
  EXPECT_FALSE(PathRule::keys_conflict(r->key(), r->key()));
  EXPECT_TRUE(PathRule::key_contains(w->key(), r->key()));
  EXPECT_FALSE(PathRule::key_contains(r->key(), w->key()));
}

// The segments view the rule's own path, not the caller's string (which may be gone).
TEST(PathRuleTest, SegmentsOutliveTheInput) {
  Rule rule;
  {
    std::string input = "/first//second/./third-is-a-long-segment/";
    rule = rules::path(input);
    input.assign(input.size(), 'x');
  }
  EXPECT_EQ(segments_of(rule), (std::vector<std::string>{"first", "second", "third-is-a-long-segment"}));
  const std::string& path = as_path(rule).path();
  for (const std::string_view segment : as_path(rule).segments()) {
    EXPECT_GE(segment.data(), path.data());
    EXPECT_LE(segment.data() + segment.size(), path.data() + path.size());
  }
}

// A copy is a rule of its own whose segments view its own path (short paths live inside the rule
// object, so views of the original would dangle once it is gone).
TEST(PathRuleTest, CopiesViewTheirOwnPath) {
  auto original = std::make_unique<PathRule>("/a/b/c", PathRule::Mode::shared);
  const PathRule copy(*original);
  PathRule assigned("/x", PathRule::Mode::exclusive);
  assigned = *original;
  original.reset();
  for (const PathRule* rule : {&copy, static_cast<const PathRule*>(&assigned)}) {
    EXPECT_EQ(std::vector<std::string>(rule->segments().begin(), rule->segments().end()),
              (std::vector<std::string>{"a", "b", "c"}));
    for (const std::string_view segment : rule->segments()) {
      EXPECT_GE(segment.data(), rule->path().data());
      EXPECT_LE(segment.data() + segment.size(), rule->path().data() + rule->path().size());
    }
    EXPECT_TRUE(rule->is_shared());
  }
  const PathRule below("/a/b/c/d", PathRule::Mode::exclusive);
  EXPECT_TRUE(copy.is_conflicting(below));
  EXPECT_TRUE(copy.is_ancestor_or_equal_of(below));
  const PathRule root("/", PathRule::Mode::exclusive);
  const PathRule root_copy(root);
  EXPECT_TRUE(root_copy.segments().empty());
}

TEST(PathRuleTest, ToStringShowsModeAndNormalisedPath) {
  EXPECT_EQ(rules::path("//a/./b/")->to_string(), "path(/a/b)");
  EXPECT_EQ(rules::read_path("/a")->to_string(), "read_path(/a)");
  EXPECT_EQ(rules::path("/")->to_string(), "path(/)");
}

TEST(PathRuleTest, AncestorCheckOnPaths) {
  EXPECT_TRUE(PathRule::is_ancestor_or_equal("/", "/"));
  EXPECT_TRUE(PathRule::is_ancestor_or_equal("/", "/a/b"));
  EXPECT_TRUE(PathRule::is_ancestor_or_equal("/a", "/a/b"));
  EXPECT_TRUE(PathRule::is_ancestor_or_equal("/a/b", "/a/b"));
  EXPECT_FALSE(PathRule::is_ancestor_or_equal("/a/b", "/a"));
  EXPECT_FALSE(PathRule::is_ancestor_or_equal("/a/b", "/a/c"));
  EXPECT_FALSE(PathRule::is_ancestor_or_equal("/a/b", "/a/bc"));  // segment-wise, not a prefix
  EXPECT_FALSE(PathRule::is_ancestor_or_equal("/a/bc", "/a/b"));
  EXPECT_FALSE(PathRule::is_ancestor_or_equal("/a", "/"));
}

TEST(PathRuleTest, PathSegmentsSplitANormalisedPath) {
  const auto split = [](std::string_view path) {
    const PathSegments segments(path);
    return std::vector<std::string>(segments.begin(), segments.end());
  };
  EXPECT_TRUE(split("/").empty());
  EXPECT_EQ(split("/a"), (std::vector<std::string>{"a"}));
  EXPECT_EQ(split("/ab/c/def"), (std::vector<std::string>{"ab", "c", "def"}));
  EXPECT_EQ(PathSegments("/ab/c/def").size(), 3U);
  EXPECT_EQ(PathSegments("/ab/c/def").front(), "ab");
  EXPECT_EQ(PathSegments("/").size(), 0U);
  static_assert(std::forward_iterator<PathSegments::iterator>);
}

}  // namespace
}  // namespace tasklet
