using System.Diagnostics;
using System.Globalization;
using System.Net;
using System.Text;
using System.Text.RegularExpressions;
using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.IoUring;

/// <summary>
/// The io_uring backend where io_uring cannot be set up, as under Docker's default seccomp profile: the sample runs
/// under deny_io_uring (deny_io_uring.c), which makes io_uring_setup, io_uring_enter and io_uring_register fail with
/// EPERM (what Docker returns) or ENOSYS (a kernel without io_uring). <c>--io auto</c> with Inline scheduling (where
/// Auto wants io_uring) must fall back to epoll with one warning; <c>--io io_uring</c> must refuse to start and say why. Without the filter, <c>--io io_uring</c> opens
/// one ring per loop thread.
/// </summary>
public sealed partial class IoUringFallbackTests
{
    private const string RingLink = DenyIoUringTests.RingLink;

    /// <summary>The start of the transport's warning when <c>Auto</c> falls back to epoll.</summary>
    private const string FallbackWarning = "io_uring is not available";

    /// <summary>Two loops, so that a warning logged once per loop, or a ring per listener, would show.</summary>
    private const int Threads = 2;

    /// <summary>Each on its own connection, so that with two loops both are very likely to serve some.</summary>
    private const int Requests = 8;

    /// <summary>How long the warning may take to reach the output after the sample started (the console logger writes
    /// from a queue of its own).</summary>
    private static readonly TimeSpan LogDelay = TimeSpan.FromSeconds(10);

    [Theory]
    [InlineData("EPERM", 1, "Operation not permitted")]
    [InlineData("ENOSYS", 38, "Function not implemented")]
    public async Task Auto_runs_on_epoll_with_one_warning_when_seccomp_denies_io_uring(string denial, int errno, string description)
    {
        await using var sample = await SampleProcess.StartAsync(
            [.. SampleArguments("auto"), "--scheduling", "inline"], launcher: await CProgram.DenyIoUringAsync(denial));
        AssertFiltered(sample);

        await AssertServesPlaintextAsync(sample);

        var deadline = Stopwatch.GetTimestamp() + (long)(LogDelay.TotalSeconds * Stopwatch.Frequency);
        while (!sample.Output.Contains(FallbackWarning, StringComparison.Ordinal) && Stopwatch.GetTimestamp() < deadline)
        {
            await Task.Delay(100);
        }

        await Task.Delay(500); // a second warning (one per loop, say) would be right behind the first
        var output = sample.Output;
        var warnings = LogEntries(output).Where(e => e.Text.Contains(FallbackWarning, StringComparison.Ordinal)).ToList();
        Assert.True(warnings.Count == 1,
            $"Expected one log entry containing '{FallbackWarning}', found {warnings.Count}.{Show(output)}");
        Assert.True(warnings[0].Level == "warn", $"The fallback is logged at level '{warnings[0].Level}', not Warning.{Show(output)}");
        Assert.True(warnings[0].Text.Contains($"{description} (errno {errno})", StringComparison.Ordinal),
            $"The warning does not say '{description} (errno {errno})'.{Show(output)}");

        var links = FdLinks(sample.Id);
        Assert.True(!links.Contains(RingLink), $"The sample holds an io_uring fd after falling back. Its fds: {Summary(links)}{Show(output)}");
    }

    [Theory]
    [InlineData("EPERM", 1)]
    [InlineData("ENOSYS", 38)]
    public async Task IoUring_fails_start_up_naming_the_errno_and_the_likely_causes_when_seccomp_denies_it(string denial, int errno)
    {
        var (exitCode, output) = await SampleProcess.RunToExitAsync(
            SampleArguments("io_uring"), launcher: await CProgram.DenyIoUringAsync(denial));

        Assert.True(exitCode != 0, $"The sample exited with 0 although io_uring was denied with {denial}.{Show(output)}");

        // The usage text names IoBackend too: the command line must be accepted, and the host's start-up fail.
        Assert.True(exitCode != SampleOptions.UsageExitCode && !output.Contains("Usage: TechEmpower", StringComparison.Ordinal),
            $"The sample rejected its command line (exit code {exitCode}) instead of failing to start the transport.{Show(output)}");
        Assert.True(!output.Contains(SampleProcess.StartupPrefix, StringComparison.Ordinal),
            $"The sample printed its startup line although io_uring was denied with {denial}.{Show(output)}");
        foreach (var expected in new[] { "IoBackend", "io_uring_setup", "seccomp" })
        {
            Assert.True(output.Contains(expected, StringComparison.Ordinal), $"The output does not mention '{expected}'.{Show(output)}");
        }

        Assert.True(Regex.IsMatch(output, $@"\berrno {errno}\b"), $"The output does not say 'errno {errno}'.{Show(output)}");
    }

    /// <summary>
    /// Where a seccomp profile kills the process on io_uring_setup or io_setup instead of refusing them (systemd's
    /// SystemCallFilter= without SystemCallErrorNumber=), a server whose backend uses neither must not call them, not
    /// even to probe: the default (Epoll), and Auto with the default Adaptive scheduling (which runs on epoll), start and serve.
    /// </summary>
    [Theory]
    [InlineData(null)]
    [InlineData("auto")]
    public async Task A_backend_that_uses_neither_serves_under_a_filter_that_kills_on_io_uring_setup_and_io_setup(string? io)
    {
        string[] arguments = io is null ? SampleArguments()[..^2] : SampleArguments(io);
        await using var sample = await SampleProcess.StartAsync(arguments, launcher: await CProgram.DenyIoUringAsync("KILL"));
        AssertFiltered(sample);

        await AssertServesPlaintextAsync(sample);

        var links = FdLinks(sample.Id);
        Assert.True(!links.Contains(RingLink), $"The sample holds an io_uring fd. Its fds: {Summary(links)}{Show(sample.Output)}");
    }

    /// <summary>The same filter kills a server whose backend does make those calls: the filter works, and the test above could fail.</summary>
    [Theory]
    [InlineData("aio")]
    [InlineData("io_uring")]
    public async Task A_backend_that_uses_AIO_or_io_uring_dies_under_that_filter(string io)
    {
        var (exitCode, output) = await SampleProcess.RunToExitAsync(SampleArguments(io), launcher: await CProgram.DenyIoUringAsync("KILL"));

        Assert.True(exitCode == DenyIoUringTests.KilledBySigsys,
            $"Expected --io {io} to die of SIGSYS ({DenyIoUringTests.KilledBySigsys}), not exit with {exitCode}.{Show(output)}");
    }

    [Fact]
    public async Task IoUring_opens_one_ring_per_loop_thread_and_serves()
    {
        await RequireIoUringAsync();
        await using var sample = await SampleProcess.StartAsync(SampleArguments("io_uring"));

        await AssertServesPlaintextAsync(sample);

        var links = FdLinks(sample.Id);
        var rings = links.Count(l => l == RingLink);
        Assert.True(rings == Threads,
            $"Expected {Threads} '{RingLink}' fds (one per loop thread), found {rings}. Its fds: {Summary(links)}{Show(sample.Output)}");
    }

    private static string[] SampleArguments(string io = "epoll") =>
        ["--urls", "http://127.0.0.1:0", "--mode", "platform", "--threads", Threads.ToString(CultureInfo.InvariantCulture), "--io", io];

    private static async Task AssertServesPlaintextAsync(SampleProcess sample)
    {
        var url = sample.Urls.SingleOrDefault() ?? throw new InvalidOperationException($"No URL in the startup line.{Show(sample.Output)}");
        using var client = new HttpClient(new SocketsHttpHandler { AllowAutoRedirect = false, UseCookies = false })
        {
            BaseAddress = new Uri(url),
            Timeout = TestTimeouts.Request,
        };

        for (var i = 1; i <= Requests; i++)
        {
            using var request = new HttpRequestMessage(HttpMethod.Get, new Uri("/plaintext", UriKind.Relative))
            {
                Version = HttpVersion.Version11,
                VersionPolicy = HttpVersionPolicy.RequestVersionExact,
            };
            request.Headers.ConnectionClose = true;
            try
            {
                using var response = await client.SendAsync(request);
                var body = await TechEmpowerRules.VerifyAsync(response, "text/plain");
                Assert.Equal("Hello, World!", Encoding.UTF8.GetString(body));
            }
            catch (Exception e) when (e is HttpRequestException or TaskCanceledException or Xunit.Sdk.XunitException)
            {
                Assert.Fail($"GET /plaintext #{i} of {Requests} failed: {e.Message}{Show(sample.Output)}");
            }
        }
    }

    /// <summary>Checks that the filter is really in place in the sample's process (the launcher exec'd it).</summary>
    private static void AssertFiltered(SampleProcess sample)
    {
        var status = File.ReadAllText($"/proc/{sample.Id}/status");
        Assert.True(Regex.IsMatch(status, @"^Seccomp:\s*2$", RegexOptions.Multiline),
            $"The sample (pid {sample.Id}) does not run under a seccomp filter:{Environment.NewLine}{status}{Show(sample.Output)}");
    }

    /// <summary>Fails with the reason when this machine cannot set up io_uring at all, so the test cannot say anything.</summary>
    private static async Task RequireIoUringAsync()
    {
        var probe = Process.Start(new ProcessStartInfo(await CProgram.PathOfAsync(CProgram.IoUringProbe))
        {
            RedirectStandardOutput = true,
            UseShellExecute = false,
        })!;
        using (probe)
        {
            var output = await probe.StandardOutput.ReadToEndAsync().WaitAsync(TestTimeouts.Request);
            if (!output.Contains("io_uring_setup: ok", StringComparison.Ordinal))
            {
                var disabled = File.Exists("/proc/sys/kernel/io_uring_disabled")
                    ? File.ReadAllText("/proc/sys/kernel/io_uring_disabled").Trim()
                    : "(absent: Linux before 6.6)";
                var seccomp = Regex.Match(File.ReadAllText("/proc/self/status"), @"^Seccomp:\s*(\d)", RegexOptions.Multiline).Groups[1].Value;
                Assert.Fail(
                    $"This machine cannot set up io_uring, which this test needs (see docs/troubleshooting.md). "
                    + $"kernel.io_uring_disabled={disabled}, seccomp mode of the test process={seccomp}, kernel {System.Runtime.InteropServices.RuntimeInformation.OSDescription}. "
                    + $"io_uring_probe said:{Environment.NewLine}{output}");
            }
        }
    }

    /// <summary>The targets of the symbolic links in <c>/proc/PID/fd</c>.</summary>
    private static List<string> FdLinks(int pid)
    {
        var links = new List<string>();
        foreach (var fd in Directory.EnumerateFileSystemEntries($"/proc/{pid}/fd"))
        {
            try
            {
                if (new FileInfo(fd).LinkTarget is { } target)
                {
                    links.Add(target);
                }
            }
            catch (IOException)
            {
                // Closed between the listing and the readlink.
            }
        }

        return links;
    }

    /// <summary>The fds by kind ("2x anon_inode:[eventpoll]"), with the files (assemblies, mostly) only counted.</summary>
    private static string Summary(List<string> links) =>
        string.Join(", ", links
            .Select(l => l.StartsWith('/') ? "file" : Digits().Replace(l, "N"))
            .GroupBy(kind => kind)
            .OrderBy(g => g.Key, StringComparer.Ordinal)
            .Select(g => $"{g.Count()}x {g.Key}"));

    private static string Show(string output) => $"{Environment.NewLine}Output of the sample:{Environment.NewLine}{output}";

    /// <summary>
    /// The sample's log entries as its console logger writes them (simple format): a line starting with the level,
    /// "warn: Category[id]", then the message on indented lines. stderr lines carry SampleProcess's "[stderr] " prefix.
    /// </summary>
    private static List<LogEntry> LogEntries(string output)
    {
        var entries = new List<LogEntry>();
        LogEntry? current = null;
        foreach (var raw in output.Split('\n'))
        {
            var line = raw.TrimEnd('\r');
            line = line.StartsWith("[stderr] ", StringComparison.Ordinal) ? line["[stderr] ".Length..] : line;
            if (LevelPrefix().Match(line) is { Success: true } level)
            {
                current = new LogEntry(level.Groups[1].Value);
                current.Lines.Append(line);
                entries.Add(current);
            }
            else if (current is not null && line.Length > 0 && char.IsWhiteSpace(line[0]))
            {
                current.Lines.Append('\n').Append(line.Trim());
            }
            else
            {
                current = null;
            }
        }

        return entries;
    }

    [GeneratedRegex(@"^(trce|dbug|info|warn|fail|crit): ")]
    private static partial Regex LevelPrefix();

    [GeneratedRegex(@"\d+")]
    private static partial Regex Digits();

    private sealed class LogEntry(string level)
    {
        public string Level { get; } = level;

        public StringBuilder Lines { get; } = new();

        public string Text => Lines.ToString();
    }
}
