# Writes OUT, a C++ source defining `const char* const tasklet::detail::<NAME>` with the text of IN,
# so that a file such as the trace timeline page is edited as itself and shipped inside the library.
# Run as a script: cmake -DIN=<file> -DOUT=<file.cpp> -DNAME=<identifier> -P TaskletEmbed.cmake
file(READ "${IN}" text)
string(FIND "${text}" ")tasklet_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw string delimiter )tasklet_embed\"")
endif()
file(WRITE "${OUT}.tmp"
     "// Generated from ${IN} by cmake/TaskletEmbed.cmake.\nnamespace tasklet::detail {\n"
     "extern const char* const ${NAME};\nconst char* const ${NAME} = R\"tasklet_embed(${text})tasklet_embed\";\n}\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
