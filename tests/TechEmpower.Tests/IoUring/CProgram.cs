using System.Collections.Concurrent;
using System.Diagnostics;

namespace TechEmpower.Tests.IoUring;

/// <summary>
/// The small C programs of these tests (<c>deny_io_uring.c</c>, <c>io_uring_probe.c</c>, copied next to the test
/// assembly under <c>IoUring/</c>), compiled at test time with the system's C compiler, once per test run, into
/// <c>IoUring/bin/</c> of the test output.
/// </summary>
public static class CProgram
{
    /// <summary>How long one compilation may take on a loaded machine.</summary>
    private static readonly TimeSpan CompileTimeout = TimeSpan.FromSeconds(120);

    private static readonly ConcurrentDictionary<string, Lazy<Task<string>>> Built = new(StringComparer.Ordinal);

    /// <summary>The seccomp launcher: <c>deny_io_uring EPERM|ENOSYS|N -- command [args...]</c>.</summary>
    public const string DenyIoUring = "deny_io_uring";

    /// <summary>Prints the outcome of each io_uring system call and of its neighbours.</summary>
    public const string IoUringProbe = "io_uring_probe";

    /// <summary>The launcher prefix that runs a command with the three io_uring calls failing with <paramref name="errno"/>.</summary>
    /// <param name="errno">EPERM, ENOSYS or a number.</param>
    /// <returns>The launcher's path and arguments, up to and including <c>--</c>.</returns>
    public static async Task<IReadOnlyList<string>> DenyIoUringAsync(string errno) => [await PathOfAsync(DenyIoUring), errno, "--"];

    /// <summary>Compiles <c>IoUring/NAME.c</c> unless this run already did, and returns the executable's path.</summary>
    /// <param name="name">The source's name without <c>.c</c>.</param>
    /// <returns>The executable's full path.</returns>
    public static Task<string> PathOfAsync(string name) =>
        Built.GetOrAdd(name, n => new Lazy<Task<string>>(() => CompileAsync(n))).Value;

    private static async Task<string> CompileAsync(string name)
    {
        var directory = Path.Combine(AppContext.BaseDirectory, "IoUring");
        var source = Path.Combine(directory, name + ".c");
        if (!File.Exists(source))
        {
            throw new InvalidOperationException($"{source} is missing from the test output (the .csproj copies IoUring/*.c there).");
        }

        var compiler = FindCompiler() ?? throw new InvalidOperationException(
            "No C compiler: neither 'cc' nor 'gcc' is on PATH. These tests compile "
            + $"{name}.c at test time; install gcc and the C library headers (Debian: apt-get install gcc libc6-dev), "
            + "which the native engine's build needs too.");

        var output = Path.Combine(directory, "bin", name);
        Directory.CreateDirectory(Path.GetDirectoryName(output)!);

        // Compiled beside its final name, then renamed over it: a concurrent test run never executes half a file.
        var partial = $"{output}.{Environment.ProcessId}.tmp";
        var compile = await RunAsync([compiler, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-o", partial, source], CompileTimeout);
        var messages = (compile.Stdout + compile.Stderr).Trim();
        if (compile.ExitCode != 0)
        {
            File.Delete(partial);
            throw new InvalidOperationException(
                $"'{compile.Command}' failed with exit code {compile.ExitCode} "
                + $"(the Linux UAPI headers come with Debian's linux-libc-dev):{Environment.NewLine}{messages}");
        }

        File.Move(partial, output, overwrite: true);
        return output;
    }

    /// <summary>Runs <paramref name="command"/> to its exit; after <paramref name="timeout"/> it is killed and a TimeoutException thrown.</summary>
    public static async Task<CommandRun> RunAsync(IReadOnlyList<string> command, TimeSpan timeout)
    {
        var start = new ProcessStartInfo(command[0])
        {
            RedirectStandardOutput = true,
            RedirectStandardError = true,
            UseShellExecute = false,
        };
        foreach (var argument in command.Skip(1))
        {
            start.ArgumentList.Add(argument);
        }

        using var process = Process.Start(start)!;
        var stdout = process.StandardOutput.ReadToEndAsync();
        var stderr = process.StandardError.ReadToEndAsync();
        try
        {
            await process.WaitForExitAsync().WaitAsync(timeout);
        }
        catch (TimeoutException)
        {
            process.Kill(entireProcessTree: true);
            throw new TimeoutException($"'{string.Join(' ', command)}' did not exit within {timeout}.");
        }

        return new CommandRun(string.Join(' ', command), process.Id, process.ExitCode, await stdout, await stderr);
    }

    private static string? FindCompiler()
    {
        var path = Environment.GetEnvironmentVariable("PATH") ?? "";
        foreach (var name in new[] { "cc", "gcc" })
        {
            foreach (var directory in path.Split(':', StringSplitOptions.RemoveEmptyEntries))
            {
                var candidate = Path.Combine(directory, name);
                if (File.Exists(candidate))
                {
                    return candidate;
                }
            }
        }

        return null;
    }
}

/// <summary>A command that ran to its exit: what it printed, and its pid (the launcher execs, so it is the command's).</summary>
public sealed record CommandRun(string Command, int ProcessId, int ExitCode, string Stdout, string Stderr)
{
    /// <summary>The probe's line for one call, or "" when it printed none.</summary>
    public string Line(string call) =>
        Stdout.Split('\n').FirstOrDefault(l => l.StartsWith(call + ": ", StringComparison.Ordinal)) ?? "";

    public override string ToString() =>
        $"{Environment.NewLine}$ {Command}{Environment.NewLine}exit code {ExitCode}{Environment.NewLine}"
        + $"stdout:{Environment.NewLine}{Stdout}stderr:{Environment.NewLine}{Stderr}";
}
