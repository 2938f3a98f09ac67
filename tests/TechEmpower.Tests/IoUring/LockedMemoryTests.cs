using System.Globalization;
using System.Net;
using System.Text.RegularExpressions;
using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.IoUring;

/// <summary>
/// The sample where locked memory is scarce, as in most containers: a process without CAP_IPC_LOCK, whose io_uring
/// rings and whose zero-copy sends' pinned pages count against RLIMIT_MEMLOCK (shared by all of the user's processes).
/// The sample runs under <c>setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock</c> (where this process has the
/// capability to drop) and <c>prlimit --memlock</c>, both of which exec their command, so its pid is the sample's.
/// </summary>
public sealed class LockedMemoryTests
{
    /// <summary>CAP_IPC_LOCK's bit in /proc/PID/status's capability masks (linux/capability.h).</summary>
    private const int CapIpcLock = 14;

    /// <summary>Room for the two loops' rings and the start-up probe's (136 KiB each), and little more.</summary>
    private const long ScarceLimit = 1024 * 1024;

    private const int Downloads = 32;
    private const int AtOnce = 8;
    private const int DownloadKib = 8 * 1024;

    /// <summary>The sample's log line when a loop's first zero-copy send was refused (TransportLog.ZeroCopyRefused).</summary>
    private const string Refused = "the kernel refused a zero-copy send";

    /// <summary>
    /// Zero-copy downloads past the limit: from Linux 6.15 io_uring's SENDMSG_ZC fails with ENOMEM once the pinned pages
    /// would exceed it, and sendmsg(MSG_ZEROCOPY) fails with ENOBUFS. Either way the connection sends the same bytes by
    /// copying, and every download completes intact; before, an ENOMEM reset the connection (of 32 downloads 8 at a
    /// time, 8 completed and the rest were cut off, "send failed ...: Cannot allocate memory (errno 12)").
    /// </summary>
    [Theory]
    [InlineData("io_uring")]
    [InlineData("epoll")]
    public async Task Zero_copy_downloads_past_the_locked_memory_limit_go_out_by_copying(string io)
    {
        await using var sample = await SampleProcess.StartAsync(
            ["--urls", "http://127.0.0.1:0", "--threads", "2", "--scheduling", "inline", "--io", io,
             "--tuning", "ZeroCopyWhenKernelCopies=true"],
            new Dictionary<string, string?>
            {
                ["Kestrel__LinuxTransport__ZeroCopySendThreshold"] = "16384",
                ["Logging__LogLevel__Kestrel.Transport.Linux"] = "Information",
            },
            Launcher(ScarceLimit));
        AssertScarce(sample, ScarceLimit);

        using var client = new HttpClient(new SocketsHttpHandler { MaxConnectionsPerServer = AtOnce })
        {
            BaseAddress = new Uri(sample.Urls.Single()),
            Timeout = TimeSpan.FromSeconds(60),
        };
        var failures = new List<string>();
        for (int wave = 0; wave < Downloads / AtOnce; wave++)
        {
            var results = await Task.WhenAll(Enumerable.Range(0, AtOnce).Select(_ => DownloadAsync(client)));
            failures.AddRange(results.Where(r => r is not null)!);
        }

        Assert.True(failures.Count == 0, $"{failures.Count} of {Downloads} downloads failed: {string.Join("; ", failures.Take(5))}{Show(sample.Output)}");
        Assert.True(sample.Output.Contains(Refused, StringComparison.Ordinal),
            $"No zero-copy send was refused, so the limit never bit and the test proves nothing.{Show(sample.Output)}");
        Assert.DoesNotContain("send failed", sample.Output, StringComparison.Ordinal);
    }

    /// <summary>
    /// IoUring where even one ring does not fit: start-up fails naming the errno, RLIMIT_MEMLOCK with its value, and
    /// what a ring needs, instead of blaming kernels before 5.12 (which the rings were charged on, and 6.18 charges too).
    /// </summary>
    [Fact]
    public async Task IoUring_fails_start_up_naming_RLIMIT_MEMLOCK_when_a_ring_does_not_fit()
    {
        const long limit = 64 * 1024;
        var (exitCode, output) = await SampleProcess.RunToExitAsync(
            ["--urls", "http://127.0.0.1:0", "--threads", "2", "--scheduling", "inline", "--io", "io_uring"],
            launcher: Launcher(limit));

        Assert.True(exitCode != 0, $"The sample started although no ring fits in {limit / 1024} KiB.{Show(output)}");
        foreach (var expected in new[] { "errno 12", "RLIMIT_MEMLOCK (64 KiB here)", "CAP_IPC_LOCK", "136 KiB" })
        {
            Assert.True(output.Contains(expected, StringComparison.Ordinal), $"The output does not say '{expected}'.{Show(output)}");
        }

        Assert.DoesNotContain("5.12", output, StringComparison.Ordinal);
    }

    /// <summary>The launcher prefix: CAP_IPC_LOCK dropped where this process has it, and the limit set.</summary>
    private static string[] Launcher(long limit)
    {
        var memlock = $"--memlock={limit}:{limit}";
        return HasCapability(File.ReadAllText("/proc/self/status"), CapIpcLock)
            ? ["setpriv", "--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock", "prlimit", memlock]
            : ["prlimit", memlock];
    }

    /// <summary>Checks that the limit is really in place in the sample's process, and the capability gone.</summary>
    private static void AssertScarce(SampleProcess sample, long limit)
    {
        var status = File.ReadAllText($"/proc/{sample.Id}/status");
        Assert.False(HasCapability(status, CapIpcLock), $"The sample (pid {sample.Id}) still has CAP_IPC_LOCK:{Environment.NewLine}{status}");
        var limits = File.ReadAllText($"/proc/{sample.Id}/limits");
        Assert.Matches(new Regex($@"^Max locked memory\s+{limit}\s+{limit}\s", RegexOptions.Multiline), limits);
    }

    private static bool HasCapability(string status, int capability)
    {
        var effective = Regex.Match(status, @"^CapEff:\s*([0-9a-f]+)", RegexOptions.Multiline).Groups[1].Value;
        return (ulong.Parse(effective, NumberStyles.HexNumber, CultureInfo.InvariantCulture) & (1UL << capability)) != 0;
    }

    /// <summary>One GET /download of <see cref="DownloadKib"/> KiB: null when every byte came (byte i is i % 251), else what went wrong.</summary>
    private static async Task<string?> DownloadAsync(HttpClient client)
    {
        long received = 0;
        try
        {
            using var response = await client.GetAsync(new Uri($"/download/{DownloadKib}", UriKind.Relative), HttpCompletionOption.ResponseHeadersRead);
            if (response.StatusCode != HttpStatusCode.OK)
            {
                return $"status {(int)response.StatusCode}";
            }

            await using var body = await response.Content.ReadAsStreamAsync();
            var buffer = new byte[64 * 1024];
            int read;
            while ((read = await body.ReadAsync(buffer)) > 0)
            {
                for (int i = 0; i < read; i++)
                {
                    if (buffer[i] != (byte)((received + i) % 251))
                    {
                        return $"byte {received + i} is {buffer[i]}, not {(received + i) % 251}";
                    }
                }

                received += read;
            }
        }
        catch (Exception e) when (e is HttpRequestException or IOException or TaskCanceledException)
        {
            return $"cut off after {received} bytes: {e.Message}";
        }

        return received == DownloadKib * 1024L ? null : $"{received} bytes, not {DownloadKib * 1024L}";
    }

    private static string Show(string output) => $"{Environment.NewLine}Sample output:{Environment.NewLine}{output}";
}
