-- wrk load for examples/file_server: wrk -s load.lua URL -- <mix>
--
--   mixed    GET and PUT of files, COPY of files, MOVE of files and of whole directories back and
--            forth, COPY and DELETE of directories, GET of directories, all on overlapping paths
--   getput   80 % GET, 20 % PUT of the same files (the benchmark's mix)
--
-- The tree (made by run_server_test.py / server_bench.py): /f/0 … /f/31 files; /m/x<i> or
-- /m/y<i> (i < 8) one file each; /d/a<j> or /d/b<j> (j < 4) a directory of 8 files each; /c/<j>
-- copies of those directories, or nothing.
--
-- Every file is "<adler32> <length>\n<payload>", so each body proves itself whole: a torn or mixed
-- file fails its checksum. A directory's GET ("dir <count>\n" then "<name> <size>\n<bytes>" per file)
-- must list all 8 files, each whole: anything else is a directory read in the middle of a MOVE,
-- COPY or DELETE. done() prints one line for the test:
--
--   verify: checked=<bodies checked> bad=<torn files> torn=<torn directories> errors=<5xx, others>
--           last_error=<an unexpected status, 0 for none>

local files, moving, dirs, per_dir = 32, 8, 4, 8

local function adler(s)
  local a, b = 1, 0
  for i = 1, #s do
    a = (a + s:byte(i)) % 65521
    b = (b + a) % 65521
  end
  return b * 65536 + a
end

local function whole_file(body)
  local sum, len, start = body:match("^(%d+) (%d+)\n()")
  if not sum then return false end
  local payload = body:sub(start)
  return #payload == tonumber(len) and adler(payload) == tonumber(sum)
end

local function whole_dir(body)
  local count, pos = body:match("^dir (%d+)\n()")
  if not count or tonumber(count) ~= per_dir then return false end
  local listed = 0
  while pos <= #body do
    local size, start = body:match("^%S+ (%d+)\n()", pos)
    if not size then return false end
    local stop = start + tonumber(size) - 1
    if stop > #body or not whole_file(body:sub(start, stop)) then return false end
    pos = stop + 1
    listed = listed + 1
  end
  return listed == per_dir
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

checked, bad, torn, errors, last_error = 0, 0, 0, 0, 0
local mix = "mixed"
local bodies = {}

function init(args)
  mix = args[1] or "mixed"
  math.randomseed(id * 7919)
  for i = 1, 64 do
    local token = ""
    for _ = 1, 16 do token = token .. string.char(math.random(97, 122)) end
    local payload = string.rep(token, math.random(4, 64))
    bodies[i] = adler(payload) .. " " .. #payload .. "\n" .. payload
  end
end

local function pick(n) return math.random(0, n - 1) end
local function either(a, b) if math.random() < 0.5 then return a, b end return b, a end

local function transfer(method, from, to)
  return wrk.format(method, from, { Destination = to })
end

function request()
  local r = math.random()
  if mix == "getput" then
    if r < 0.8 then return wrk.format("GET", "/f/" .. pick(files)) end
    return wrk.format("PUT", "/f/" .. pick(files), nil, bodies[math.random(#bodies)])
  end
  local i, j = pick(moving), pick(dirs)
  if r < 0.25 then return wrk.format("GET", "/f/" .. pick(files)) end
  if r < 0.37 then return wrk.format("PUT", "/f/" .. pick(files), nil, bodies[math.random(#bodies)]) end
  if r < 0.42 then
    local from = pick(files)
    return transfer("COPY", "/f/" .. from, "/f/" .. (from + 1 + pick(files - 1)) % files)
  end
  if r < 0.48 then return transfer("MOVE", either("/m/x" .. i, "/m/y" .. i)) end
  if r < 0.54 then return wrk.format("GET", (either("/m/x" .. i, "/m/y" .. i))) end
  if r < 0.64 then return transfer("MOVE", either("/d/a" .. j, "/d/b" .. j)) end
  if r < 0.78 then return wrk.format("GET", (either("/d/a" .. j, "/d/b" .. j))) end
  if r < 0.86 then return transfer("COPY", (either("/d/a" .. j, "/d/b" .. j)), "/c/" .. j) end
  if r < 0.90 then return wrk.format("DELETE", "/c/" .. j) end
  return wrk.format("GET", "/c/" .. j)
end

function response(status, headers, body)
  if status == 200 then
    checked = checked + 1
    if body:sub(1, 4) == "dir " then
      if not whole_dir(body) then torn = torn + 1 end
    elseif not whole_file(body) then
      bad = bad + 1
    end
  elseif status ~= 201 and status ~= 204 and status ~= 404 and status ~= 412 then
    errors = errors + 1  -- a MOVE onto an existing path is 412; nothing else is expected
    last_error = status
  end
end

function done(summary, latency, requests)
  local total = { checked = 0, bad = 0, torn = 0, errors = 0, last_error = 0 }
  for _, thread in ipairs(threads) do
    for key in pairs(total) do total[key] = total[key] + thread:get(key) end
    if thread:get("last_error") ~= 0 then total.last_error = thread:get("last_error") end
  end
  io.write(string.format("verify: checked=%d bad=%d torn=%d errors=%d last_error=%d\n",
                         total.checked, total.bad, total.torn, total.errors, total.last_error))
end
