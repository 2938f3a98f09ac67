using System.Text.RegularExpressions;

namespace TechEmpower.Tests.IoUring;

/// <summary>
/// The seccomp launcher on its own (deny_io_uring.c), checked with io_uring_probe.c, which makes each io_uring system
/// call and its neighbours by number: what IoUringFallbackTests rely on, proven without the transport.
/// </summary>
public sealed class DenyIoUringTests
{
    /// <summary>What <c>/proc/PID/fd</c> shows for an io_uring instance's fd (checked below where io_uring is allowed).</summary>
    public const string RingLink = "anon_inode:[io_uring]";

    /// <summary>A process killed by SIGSYS (31), as .NET reports its exit code: 128 + the signal.</summary>
    public const int KilledBySigsys = 128 + 31;

    private static readonly TimeSpan RunTimeout = TimeSpan.FromSeconds(30);

    [Theory]
    [InlineData("EPERM", 1, "Operation not permitted")]
    [InlineData("ENOSYS", 38, "Function not implemented")]
    [InlineData("95", 95, "Operation not supported")]
    public async Task The_three_io_uring_calls_fail_with_the_chosen_errno_and_their_neighbours_do_not(
        string argument, int errno, string description)
    {
        var probe = await CProgram.PathOfAsync(CProgram.IoUringProbe);
        var run = await RunAsync([.. await CProgram.DenyIoUringAsync(argument), probe]);

        Assert.True(run.ExitCode == 0, $"The probe under the launcher exited with {run.ExitCode}.{run}");
        foreach (var call in new[] { "io_uring_setup", "io_uring_enter", "io_uring_register" })
        {
            Assert.True(run.Line(call) == $"{call}: errno {errno} ({description})", $"Expected {call} to fail with errno {errno}.{run}");
        }

        // Just below and just above the io_uring numbers (424 and 428): the filter's range ends where it should.
        foreach (var call in new[] { "pidfd_send_signal", "open_tree" })
        {
            Assert.False(run.Line(call).StartsWith($"{call}: errno {errno} ", StringComparison.Ordinal), $"{call} was filtered too.{run}");
        }
    }

    /// <summary>KILL: the first io_uring call kills the probe with SIGSYS (exit code 128 + 31), before it prints a line.</summary>
    [Fact]
    public async Task With_KILL_the_first_io_uring_call_kills_the_process_with_SIGSYS()
    {
        var run = await RunAsync([.. await CProgram.DenyIoUringAsync("KILL"), await CProgram.PathOfAsync(CProgram.IoUringProbe)]);

        Assert.True(run.ExitCode == KilledBySigsys, $"Expected death by SIGSYS ({KilledBySigsys}).{run}");
        Assert.True(run.Line("io_uring_setup") == "", $"The probe went on past io_uring_setup.{run}");
    }

    [Fact]
    public async Task With_KILL_a_command_that_makes_neither_call_runs_normally()
    {
        var run = await RunAsync([.. await CProgram.DenyIoUringAsync("KILL"), "cat", "/proc/self/status"]);

        Assert.True(run.ExitCode == 0, $"cat under the KILL filter exited with {run.ExitCode}.{run}");
        Assert.True(StatusField(run.Stdout, "Seccomp") == "2", $"The command does not run in seccomp filter mode (2).{run}");
    }

    [Fact]
    public async Task Without_the_launcher_nothing_fails_with_its_errno_and_a_ring_fd_is_named_anon_inode_io_uring()
    {
        var run = await RunAsync([await CProgram.PathOfAsync(CProgram.IoUringProbe)]);

        Assert.True(run.ExitCode == 0, $"The probe exited with {run.ExitCode}.{run}");
        Assert.DoesNotContain("errno 95 ", run.Stdout, StringComparison.Ordinal);

        // Where this machine allows io_uring at all, this is the link IoUringFallbackTests count in /proc/PID/fd.
        var setup = run.Line("io_uring_setup");
        if (setup.StartsWith("io_uring_setup: ok", StringComparison.Ordinal))
        {
            Assert.True(setup == $"io_uring_setup: ok (fd link {RingLink})", $"Unexpected ring fd link.{run}");
        }
    }

    [Fact]
    public async Task The_command_runs_in_the_launchers_process_with_the_filter_and_no_new_privileges()
    {
        var run = await RunAsync([.. await CProgram.DenyIoUringAsync("EPERM"), "cat", "/proc/self/status"]);

        Assert.True(run.ExitCode == 0, $"cat under the launcher exited with {run.ExitCode}.{run}");
        Assert.True(StatusField(run.Stdout, "Pid") == run.ProcessId.ToString(System.Globalization.CultureInfo.InvariantCulture),
            $"The command did not keep the launcher's pid {run.ProcessId}, so /proc/PID would name another process.{run}");
        Assert.True(StatusField(run.Stdout, "Seccomp") == "2", $"The command does not run in seccomp filter mode (2).{run}");
        Assert.True(StatusField(run.Stdout, "NoNewPrivs") == "1", $"no_new_privs is not set.{run}");
    }

    [Theory]
    [InlineData(2, "usage: deny_io_uring", "EPERM", "true")]
    [InlineData(2, "usage: deny_io_uring", "EPERM", "true", "--")]
    [InlineData(2, "'EWHAT' is not EPERM, ENOSYS, KILL", "EWHAT", "--", "true")]
    [InlineData(2, "'4096' is not EPERM, ENOSYS, KILL", "4096", "--", "true")]
    [InlineData(127, "cannot execute '/nonexistent/command': No such file or directory", "EPERM", "--", "/nonexistent/command")]
    public async Task Bad_command_lines_fail_with_a_message(int exitCode, string message, params string[] arguments)
    {
        var run = await RunAsync([await CProgram.PathOfAsync(CProgram.DenyIoUring), .. arguments]);

        Assert.True(run.ExitCode == exitCode, $"Expected exit code {exitCode}.{run}");
        Assert.Contains(message, run.Stderr, StringComparison.Ordinal);
    }

    private static string StatusField(string status, string name) =>
        Regex.Match(status, $@"^{name}:\s*(\S+)", RegexOptions.Multiline) is { Success: true } match ? match.Groups[1].Value : "";

    private static Task<CommandRun> RunAsync(IReadOnlyList<string> command) => CProgram.RunAsync(command, RunTimeout);
}
