using System.Buffers;
using System.Runtime.InteropServices;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Connection;

/// <summary>
/// One connection's zero-copy sends in flight. The kernel numbers a socket's MSG_ZEROCOPY sends from 0,
/// one id per call that queued data, and reports them done in ranges of ids; each send holds the blocks
/// its iovecs pointed into until then. Used under the connection's send lock, or on its loop.
/// </summary>
internal sealed class ZeroCopySends(uint firstId = 0)
{
    private readonly List<ZeroCopyBlock> _staged = [];
    private readonly Queue<ZeroCopyBlock> _held = new();
    private readonly List<(uint Id, int Blocks, bool Done)> _sends = [];
    private uint _nextId = firstId;

    /// <summary>Set once the kernel reported that it copied a send (loopback, or a device without scatter-gather).</summary>
    public bool KernelCopies { get; private set; }

    /// <summary>Set after ENOBUFS, for the next send only (msg_zerocopy.rst: over the socket's optmem limit).</summary>
    public bool SkipNext { get; set; }

    public int InFlight => _sends.Count;

    /// <summary>
    /// Collects the blocks behind the first <paramref name="maxSegments"/> non-empty segments of
    /// <paramref name="buffer"/>; false (and nothing staged) when any of them is memory this pool did not
    /// lend, which a zero-copy send must not point at.
    /// </summary>
    public bool Stage(in ReadOnlySequence<byte> buffer, int maxSegments)
    {
        _staged.Clear();
        foreach (var segment in buffer)
        {
            if (segment.IsEmpty)
            {
                continue;
            }

            if (!MemoryMarshal.TryGetMemoryManager<byte, ZeroCopyBlock>(segment, out var block))
            {
                _staged.Clear();
                return false;
            }

            _staged.Add(block);
            if (_staged.Count == maxSegments)
            {
                break;
            }
        }

        return _staged.Count > 0;
    }

    /// <summary>
    /// After a send: false when it was not a staged zero-copy send. Otherwise true; a call that sent
    /// bytes took the next id, and its blocks stay held until <see cref="Complete"/>; a failed call took none.
    /// </summary>
    public bool Commit(SysResult sent)
    {
        if (_staged.Count == 0)
        {
            return false;
        }

        if (!sent.IsError && sent.Value > 0)
        {
            foreach (var block in _staged)
            {
                block.AddSend();
                _held.Enqueue(block);
            }

            _sends.Add((_nextId++, _staged.Count, false));
        }

        _staged.Clear();
        return true;
    }

    /// <summary>
    /// The kernel completed ids <paramref name="first"/>..<paramref name="last"/> (inclusive, modulo 2^32).
    /// Blocks go back in send order, so a send completed ahead of an earlier one waits for it.
    /// Returns the number of sends this completed.
    /// </summary>
    public int Complete(uint first, uint last, bool copied)
    {
        KernelCopies |= copied;
        uint span = last - first;
        int completed = 0;
        for (int i = 0; i < _sends.Count; i++)
        {
            var send = _sends[i];
            if (!send.Done && send.Id - first <= span)
            {
                _sends[i] = (send.Id, send.Blocks, true);
                completed++;
            }
        }

        int finished = 0;
        while (finished < _sends.Count && _sends[finished].Done)
        {
            for (int b = 0; b < _sends[finished].Blocks; b++)
            {
                _held.Dequeue().ReleaseSend();
            }

            finished++;
        }

        _sends.RemoveRange(0, finished);
        return completed;
    }

    /// <summary>After a reset and close: the kernel dropped the queued data along with the socket.</summary>
    public void ReleaseAll()
    {
        while (_held.TryDequeue(out var block))
        {
            block.ReleaseSend();
        }

        _sends.Clear();
        _staged.Clear();
    }
}
